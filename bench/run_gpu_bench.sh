#!/usr/bin/env bash
# GPT-2 124M and 350M at sequence 1024 in bf16 on one GPU: troupe (`troupe bench gpt --device cuda
# --bf16`) against PyTorch on the same model, batch and GPU (bench/torch_gpt.py train-bench --device
# cuda --dtype bf16: autocast, fp32 AdamW, F.scaled_dot_product_attention), eager and torch.compile.
# Tokens/s, model TFLOP/s (Megatron's count, GptConfig::flops_per_iteration) and MFU against the
# dense bf16 peak (--peak-tflops, H200 / H100 SXM: 989). Writes a Markdown table (--out) and the raw
# JSON lines beside it (.jsonl).
#
#   bash bench/run_gpu_bench.sh [--out FILE] [--iters N] [--warmup-iters N] [--micro-batch-size B]
#                               [--peak-tflops T] [--models 124m,350m] [--timeout S] [--budget S]
# --timeout: the most one run may take; --budget: the whole script's seconds (a run that might not
# fit in what is left is skipped and listed as such; 0: no budget).
# Environment: TROUPE_BIN (default build/bin/troupe), PYTHON (default python3: the GPU machine's own
# PyTorch; Debian's has no CUDA).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="$root/bench/results/gpu_latest.md"
iters=10
warmup=3
micro=8
peak=989
models=124m,350m
limit=240
budget=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --warmup-iters) warmup="$2"; shift 2 ;;
    --micro-batch-size) micro="$2"; shift 2 ;;
    --peak-tflops) peak="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_gpu_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$iters" "$warmup" "$micro" "$limit" "$budget"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "run_gpu_bench.sh: expected a non-negative integer, got '$v'" >&2; exit 2; }
done
[[ "$peak" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "run_gpu_bench.sh: --peak-tflops must be a number, got '$peak'" >&2; exit 2; }
TROUPE_BIN="${TROUPE_BIN:-$root/build/bin/troupe}"
PYTHON="${PYTHON:-python3}"
[[ -x "$TROUPE_BIN" ]] || { echo "run_gpu_bench.sh: no troupe binary at $TROUPE_BIN (build, or set TROUPE_BIN)" >&2; exit 1; }
jsonl="${out%.md}.jsonl"
mkdir -p "$(dirname "$out")"
: > "$jsonl"

model_args() {  # the architecture of $1 (GPT-2 small / medium, vocabulary 50304 as Megatron pads it)
  case "$1" in
    124m) echo "--num-layers 12 --hidden-size 768 --num-attention-heads 12" ;;
    350m) echo "--num-layers 24 --hidden-size 1024 --num-attention-heads 16" ;;
    *) echo "run_gpu_bench.sh: --models: unknown model '$1' -- use 124m and/or 350m" >&2; return 1 ;;
  esac
}
failures=0
one() {  # one LABEL MODEL COMMAND...: runs COMMAND, tags its JSON line with LABEL and MODEL
  local label=$1 name=$2
  shift 2
  if ((budget > 0 && SECONDS + limit > budget)); then
    echo "-- $name $label skipped: ${SECONDS} s of the ${budget} s budget used" >&2
    return
  fi
  echo "== $name $label: $*" >&2
  local line
  if line=$(timeout "$limit" "$@" 2> "$jsonl.$label.$name.err" | tail -1) && [[ "$line" == "{"* ]]; then
    "$PYTHON" -c 'import json,sys; j=json.loads(sys.argv[1]); j["run"]=sys.argv[2]; j["model_name"]=sys.argv[3]; print(json.dumps(j))' \
      "$line" "$label" "$name" >> "$jsonl"
    echo "   $line" >&2
  else
    echo "!! $name $label failed (exit ${PIPESTATUS[0]:-?}); the last lines of its output:" >&2
    tail -20 "$jsonl.$label.$name.err" >&2
    failures=$((failures + 1))
  fi
}
IFS=, read -ra names <<< "$models"
common_of() {  # the shared flags of model $1
  local args
  args=$(model_args "$1") || return 1
  echo "$args --seq-length 1024 --micro-batch-size $micro --vocab-size 50304 --warmup-iters $warmup --iters $iters"
}
# troupe and PyTorch eager first, then the per-op table, the compiled runs (minutes of compilation) last.
for name in "${names[@]}"; do
  common=$(common_of "$name") || exit 2
  # shellcheck disable=SC2086 # the flags' words
  one troupe "$name" "$TROUPE_BIN" bench gpt $common --device cuda --bf16 --json
  # shellcheck disable=SC2086
  one pytorch_eager "$name" "$PYTHON" "$here/torch_gpt.py" train-bench $common --device cuda --dtype bf16
done
# Each op's TFLOP/s or GB/s at 350M's sizes, against the peaks measured in the same run.
ops_bin="${OPS_BIN:-$(dirname "$TROUPE_BIN")/bench_cuda_ops}"
[[ -x "$ops_bin" ]] || ops_bin="$root/build/bench/bench_cuda_ops"
ops_out="${out%.md}.ops.txt"
if [[ -x "$ops_bin" ]] && ((budget > 0 && SECONDS + limit > budget)); then
  echo "-- per-op skipped: ${SECONDS} s of the ${budget} s budget used" >&2
elif [[ -x "$ops_bin" ]]; then
  echo "== per-op: $ops_bin --peak-tflops $peak" >&2
  timeout "$limit" "$ops_bin" --peak-tflops "$peak" > "$ops_out" 2>&1 || { cat "$ops_out" >&2; failures=$((failures + 1)); }
  cat "$ops_out" >&2
else
  echo "!! no bench_cuda_ops binary (build/bench/bench_cuda_ops; set OPS_BIN)" >&2
  failures=$((failures + 1))
fi
for name in "${names[@]}"; do
  common=$(common_of "$name") || exit 2
  # shellcheck disable=SC2086
  one pytorch_compile "$name" "$PYTHON" "$here/torch_gpt.py" train-bench $common --device cuda --dtype bf16 --compile
done

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
"$PYTHON" - "$jsonl" "$out" "$peak" "${gpu:-unknown GPU}" "$micro" "$iters" "$warmup" "$ops_out" <<'PY'
import datetime, json, os, sys
jsonl, out, peak, gpu, micro, iters, warmup, ops_out = sys.argv[1:9]
peak = float(peak)
rows = [json.loads(l) for l in open(jsonl) if l.strip()]
by = {(r["model_name"], r["run"]): r for r in rows}
lines = [f"# GPU benchmark: GPT-2 in bf16 on {gpu}", "",
         f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; sequence 1024, micro-batch {micro}, vocabulary 50304, "
         f"{warmup} warm-up + {iters} timed iterations; MFU against {peak:g} TFLOP/s (dense bf16); "
         "model FLOPs by Megatron's count. Command: `bash bench/run_gpu_bench.sh`.", "",
         "| model | run | tokens/s | ms/iter | model TFLOP/s | MFU | troupe / this |",
         "|---|---|---:|---:|---:|---:|---:|"]
for name in sorted({r["model_name"] for r in rows}):
    t = by.get((name, "troupe"))
    for run in ("troupe", "pytorch_eager", "pytorch_compile"):
        r = by.get((name, run))
        if not r:
            lines.append(f"| {name} | {run} | failed or skipped (see the log) | | | | |")
            continue
        ratio = f"{t['tokens_per_sec'] / r['tokens_per_sec']:.2f}x" if t and run != "troupe" else ""
        lines.append(f"| {name} | {run} | {r['tokens_per_sec']:.0f} | {r['ms_per_iter']:.1f} | {r['model_tflops']:.1f} | "
                     f"{100 * r['model_tflops'] / peak:.1f}% | {ratio} |")
if os.path.exists(ops_out):
    lines += ["", "Each op at GPT-2 350M's sizes (bf16, micro-batch 8 x 1024), `bench_cuda_ops`:", "", "```"]
    lines += open(ops_out).read().rstrip().split("\n") + ["```"]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit "$failures"
