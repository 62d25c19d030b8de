#!/usr/bin/env bash
# troupe vs PyTorch training throughput, fp32, same thread count, both measured in this one invocation:
#   --model gpt2 (default): the reference GPT-2 (4 layers, hidden 384, 6 heads, seq 256, micro-batch 8, vocab 50304);
#   --model llama: a LLaMA of the same scale (RMSNorm, rotary base 10000, 2 query groups, SwiGLU ffn 1024,
#                  no linear biases, untied head, vocab 32000);
#   --model moe: the GPT-2 with every MLP a mixture of 8 GELU experts of width 4·hidden, Megatron-Core's top-2
#                router (softmax, the two largest renormalised), dropless, load-balancing aux loss x 0.01
#                (troupe: --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.01; torch_gpt.py: router
#                nn.Linear, torch.topk, index_select dispatch per expert, index_add_ combine).
# Prints a Markdown table and writes it to --out (default bench/results/latest.md, latest_llama.md for llama,
# latest_moe.md for moe).
#
# Usage: bench/run_vs_pytorch.sh [--model gpt2|llama|moe] [--iters N] [--warmup-iters N] [--threads N] [--out FILE]
# Environment: TROUPE_BIN (default build/bin/troupe), PYTHON (default /usr/bin/python3, Debian's, with torch).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

iters=10
warmup=2
threads=2
model=gpt2
out=""

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --model=*) model="${1#*=}"; shift ;;
    --iters) iters="$2"; shift 2 ;;
    --iters=*) iters="${1#*=}"; shift ;;
    --warmup-iters) warmup="$2"; shift 2 ;;
    --warmup-iters=*) warmup="${1#*=}"; shift ;;
    --threads) threads="$2"; shift 2 ;;
    --threads=*) threads="${1#*=}"; shift ;;
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_vs_pytorch.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in "$iters" "$warmup" "$threads"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "run_vs_pytorch.sh: expected a non-negative integer, got '$v'" >&2; exit 2; }
done
[[ "$iters" -ge 1 && "$threads" -ge 1 ]] || { echo "run_vs_pytorch.sh: --iters and --threads must be >= 1" >&2; exit 2; }
case "$model" in
  gpt2) out="${out:-$root/bench/results/latest.md}" ;;
  llama) out="${out:-$root/bench/results/latest_llama.md}" ;;
  moe) out="${out:-$root/bench/results/latest_moe.md}" ;;
  *) echo "run_vs_pytorch.sh: --model $model is not a benchmark model -- use gpt2, llama or moe" >&2; exit 2 ;;
esac

TROUPE_BIN="${TROUPE_BIN:-$root/build/bin/troupe}"
PYTHON="${PYTHON:-/usr/bin/python3}"
if [[ ! -x "$TROUPE_BIN" ]]; then
  echo "run_vs_pytorch.sh: troupe binary '$TROUPE_BIN' not found (build it, or set TROUPE_BIN)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
  echo "run_vs_pytorch.sh: '$PYTHON' cannot import torch and numpy (set PYTHON)" >&2
  exit 1
fi

# The same sizes for both implementations; each is told the family its own way (troupe: Megatron's flags,
# torch_gpt.py: --model llama with the LLaMA sizes).
model_args=(--num-layers 4 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --micro-batch-size 8)
if [[ "$model" == llama ]]; then
  model_args+=(--vocab-size 32000 --num-query-groups 2 --ffn-hidden-size 1024)
  troupe_family=(--normalization RMSNorm --position-embedding-type rope --rotary-base 10000 --group-query-attention
                 --swiglu --disable-bias-linear --untie-embeddings-and-output-weights)
  torch_family=(--model llama --rotary-base 10000)
  model_line="LLaMA: 4 layers, hidden 384, 6 heads in 2 query groups (GQA), SwiGLU ffn 1024, RMSNorm, rotary \
(rotate-half, base 10000), no linear biases, untied head, seq 256, micro-batch 8, vocab 32000"
elif [[ "$model" == moe ]]; then
  model_args+=(--vocab-size 50304)
  troupe_family=(--num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 0.01)
  torch_family=(--num-experts 8 --topk 2 --moe-aux-loss-coeff 0.01)
  model_line="GPT-2 MoE: 4 layers, hidden 384, 6 heads, seq 256, micro-batch 8, vocab 50304; every layer's MLP 8 GELU \
experts of width 1536, Megatron-Core's top-2 router (softmax, the two largest renormalised), dropless, load-balancing \
aux loss x 0.01"
else
  model_args+=(--vocab-size 50304)
  troupe_family=()
  torch_family=()
  model_line="GPT-2: 4 layers, hidden 384, 6 heads, seq 256, micro-batch 8, vocab 50304"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "== troupe ($TROUPE_BIN), $threads threads, $warmup warm-up + $iters timed iterations" >&2
if ! "$TROUPE_BIN" bench gpt "${model_args[@]}" ${troupe_family[@]+"${troupe_family[@]}"} --num-threads "$threads" --warmup-iters "$warmup" \
     --iters "$iters" --json >"$tmp/troupe.out" 2>"$tmp/troupe.err"; then
  cat "$tmp/troupe.out" "$tmp/troupe.err" >&2
  echo "run_vs_pytorch.sh: troupe bench failed" >&2
  exit 1
fi

echo "== PyTorch ($PYTHON bench/torch_gpt.py), $threads threads, $warmup warm-up + $iters timed iterations" >&2
if ! "$PYTHON" "$here/torch_gpt.py" train-bench "${model_args[@]}" ${torch_family[@]+"${torch_family[@]}"} --threads "$threads" --warmup-iters "$warmup" \
     --iters "$iters" >"$tmp/torch.out" 2>"$tmp/torch.err"; then
  cat "$tmp/torch.out" "$tmp/torch.err" >&2
  echo "run_vs_pytorch.sh: PyTorch bench failed" >&2
  exit 1
fi

cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || true)"
mkdir -p "$(dirname "$out")"
"$PYTHON" - "$tmp/troupe.out" "$tmp/torch.out" "$out" "$threads" "$iters" "$warmup" "${cpu:-unknown CPU}" \
  "$(nproc 2>/dev/null || echo '?')" "$model" "$model_line" <<'EOF'
import datetime, json, sys

troupe_path, torch_path, out_path, threads, iters, warmup, cpu, ncpu, model, model_line = sys.argv[1:11]

def last_json(path, impl):
    """The last stdout line that is a JSON object with the expected "impl" (logs may precede it)."""
    found = None
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("impl", impl) == impl:
            found = obj
    if found is None:
        sys.exit(f"run_vs_pytorch.sh: no JSON result line from {impl} in {path}")
    return found

tr = last_json(troupe_path, "troupe")
pt = last_json(torch_path, "pytorch")
for key in ("tokens_per_sec", "ms_per_iter", "model_tflops", "model_flops_per_iter", "sgemm_peak_gflops"):
    if key not in tr:
        sys.exit(f"run_vs_pytorch.sh: troupe's JSON lacks {key!r}: {tr}")
peak_gflops = float(tr["sgemm_peak_gflops"])
# One FLOP count for both rows: troupe's (GptConfig::flops_per_iteration, GEMM by GEMM); torch_gpt.py's, written
# apart in Megatron-LM's closed form, must agree, or the two were not given the same model.
flops = float(tr["model_flops_per_iter"])
if abs(pt["model_flops_per_iter"] - flops) > 1e-9 * flops:
    sys.exit(f"run_vs_pytorch.sh: the model FLOPs disagree: troupe {flops:.6g}, torch_gpt.py "
             f"{pt['model_flops_per_iter']:.6g} per iteration -- the two models differ")
if "parameters" in tr and "parameters" in pt and tr["parameters"] != pt["parameters"]:
    sys.exit(f"run_vs_pytorch.sh: troupe's model has {tr['parameters']} parameters, PyTorch's {pt['parameters']} "
             "-- the two models differ")

pt_tflops = flops / (pt["ms_per_iter"] / 1000.0) / 1e12
tr_tflops = float(tr["model_tflops"])
tr_frac = (float(tr["fraction_of_peak"]) if "fraction_of_peak" in tr
           else tr_tflops * 1e3 / peak_gflops if peak_gflops > 0 else float("nan"))
pt_frac = pt_tflops * 1e3 / peak_gflops if peak_gflops > 0 else float("nan")
ratio = tr["tokens_per_sec"] / pt["tokens_per_sec"]

rows = [
    ("troupe", tr["tokens_per_sec"], tr["ms_per_iter"], tr_tflops, tr_frac, ratio),
    (f"PyTorch {pt.get('torch_version', '')}".strip(), pt["tokens_per_sec"], pt["ms_per_iter"], pt_tflops, pt_frac, 1.0),
]
lines = [
    f"# troupe vs PyTorch: {dict(llama='LLaMA', moe='GPT-2 MoE').get(model, 'GPT-2')} training throughput (fp32, CPU)",
    "",
    f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
    f"- machine: {cpu}, {ncpu} logical CPUs; {threads} threads for both",
    f"- model: {model_line} ({pt.get('parameters', 0) / 1e6:.1f}M parameters; AdamW, grad clipping 1.0, "
    "one micro-batch per iteration)",
    f"- {warmup} warm-up + {iters} timed iterations each; model FLOPs per iteration {flops:.4g} "
    "(Megatron-LM's count: 12·B·s·l·h²·((1 + G/H + s/2h)·q/h + g·F/h + Vp/2lh), the attention scores over the "
    "causal half" + ("; an MoE layer's F·g is what one token computes: k experts' and the router's E/2)"
                     if model == "moe" else ")"),
    f"- sgemm peak measured by troupe: {peak_gflops:.1f} GFLOP/s",
    "",
    "| implementation | tokens/s | ms/iter | model TFLOP/s | % of sgemm peak | tokens/s vs PyTorch |",
    "|---|---:|---:|---:|---:|---:|",
]
for name, tps, ms, tf, frac, r in rows:
    lines.append(f"| {name} | {tps:,.0f} | {ms:,.1f} | {tf:.4f} | {100.0 * frac:.1f}% | {r:.2f}x |")
lines += ["", f"troupe / PyTorch tokens/s: **{ratio:.2f}x**", ""]
text = "\n".join(lines)
with open(out_path, "w", encoding="utf-8") as f:
    f.write(text)
print(text, end="")
EOF
echo "(written to $out)" >&2
