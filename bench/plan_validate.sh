#!/usr/bin/env bash
# troupe plan against measured runs on this machine (docs/PLAN.md, "Validation here"; issue 30).
# For each layout of two model sizes -- 1x1x1, tp 2, pp 2 under each schedule, dp 2 with ZeRO 0-3,
# recompute full and selective, optimizer offload, and dp 2 and tp 2 over two processes (troupe
# launch, UCX) -- the prediction of `troupe plan --gpu cpu --gpus-per-node RANKS` with every size
# fixed (the median of three plans), against a measured run of the same flags:
#   time    the median ms/iteration of iterations 3..N (--metrics-file)
#   memory  what the ranks added to the process: its peak resident memory (troupe's own figure at the
#           end) less what it held before the ranks allocated anything (its note at the start), from
#           rank 0's process, against the plan's memory of the process (its ranks' sum; one rank per
#           process under launch)
# Then: each prediction's error, and whether the predicted best three come in the measured order.
# A third model, with 4 experts (top-2), runs 1x1x1, dp 2 with and without ep 2, and ep 2 over two processes.
#   bench/plan_validate.sh [--iters 8] [--threads N] [--only small|large|moe] [--max-layouts N] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=8 THREADS=$(nproc) ONLY="" OUT="" MAX_LAYOUTS=1000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iters) ITERS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --max-layouts) MAX_LAYOUTS="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "plan_validate.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="$(pwd)/${TROUPE_BIN:-build/bin/troupe}"
[[ -x "$troupe" ]] || { echo "plan_validate.sh: no troupe at $troupe (build it, or set TROUPE_BIN)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/troupe-planvalidate.XXXXXX)
trap 'rm -rf "$work"' EXIT

# name | layers hidden heads seq vocab global-batch micro-batch | the model's own flags
models=("small|4 256 8 256 4096 8 2|" "large|8 512 8 512 8192 8 2|"
        "moe|4 256 8 256 4096 8 2|--num-experts 4 --moe-router-topk 2")
# label | ranks | processes | flags
layouts=(
  "1x1x1|1|1|"
  "tp 2|2|1|--tensor-model-parallel-size 2"
  "pp 2 1f1b|2|1|--pipeline-model-parallel-size 2 --pipeline-schedule 1f1b"
  "pp 2 gpipe|2|1|--pipeline-model-parallel-size 2 --pipeline-schedule gpipe"
  "pp 2 interleaved|2|1|--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage HALF"
  "pp 2 zb-h1|2|1|--pipeline-model-parallel-size 2 --pipeline-schedule zb-h1"
  "dp 2 ZeRO-0|2|1|--data-parallel-size 2 --zero-stage 0"
  "dp 2 ZeRO-1|2|1|--data-parallel-size 2 --zero-stage 1"
  "dp 2 ZeRO-2|2|1|--data-parallel-size 2 --zero-stage 2"
  "dp 2 ZeRO-3|2|1|--data-parallel-size 2 --zero-stage 3"
  "recompute full|1|1|--recompute-granularity full"
  "recompute selective|1|1|--recompute-granularity selective"
  "offload cpu|1|1|--zero-stage 1 --offload-optimizer cpu"
  "dp 2, 2 processes|2|2|--zero-stage 1"
  "tp 2, 2 processes|2|2|--tensor-model-parallel-size 2"
)
# The MoE model's layouts: its experts whole on one rank, and split over an expert-parallel group.
moe_layouts=(
  "1x1x1|1|1|"
  "dp 2 ZeRO-1|2|1|--data-parallel-size 2 --zero-stage 1"
  "dp 2 ep 2 ZeRO-1|2|1|--data-parallel-size 2 --zero-stage 1 --expert-model-parallel-size 2"
  "dp 2 ep 2, 2 processes|2|2|--zero-stage 1 --expert-model-parallel-size 2"
)
# Every size the search would otherwise choose is given: what is not named above is 1 / none / 1f1b.
defaults() {
  local flags=" $1 "
  local out=()
  [[ $flags == *" --tensor-model-parallel-size "* ]] || out+=(--tensor-model-parallel-size 1)
  [[ $flags == *" --pipeline-model-parallel-size "* ]] || out+=(--pipeline-model-parallel-size 1)
  [[ $flags == *" --zero-stage "* ]] || out+=(--zero-stage 0)
  [[ $flags == *" --recompute-granularity "* ]] || out+=(--recompute-granularity none)
  [[ $flags == *" --offload-optimizer "* ]] || out+=(--offload-optimizer none)
  [[ $flags == *" --pipeline-schedule "* || $flags == *" --num-layers-per-virtual-pipeline-stage "* ]] ||
    out+=(--pipeline-schedule 1f1b)
  [[ -z "$2" || $flags == *" --expert-model-parallel-size "* ]] || out+=(--expert-model-parallel-size 1)
  echo "${out[*]}"
}

: > "$work/rows.tsv"
for model in "${models[@]}"; do
  IFS='|' read -r name dims model_flags <<< "$model"
  [[ -z "$ONLY" || "$ONLY" == "$name" ]] || continue
  read -r L H A S V G M <<< "$dims"
  base=(--num-layers "$L" --hidden-size "$H" --num-attention-heads "$A" --seq-length "$S" --max-position-embeddings "$S"
        --global-batch-size "$G" --micro-batch-size "$M" --tokenizer-type NullTokenizer --vocab-size "$V"
        --hidden-dropout 0 --attention-dropout 0)
  read -r -a own <<< "$model_flags"
  base+=("${own[@]}")
  list=("${layouts[@]:0:$MAX_LAYOUTS}")
  [[ -n "$model_flags" ]] && list=("${moe_layouts[@]:0:$MAX_LAYOUTS}")
  for entry in "${list[@]}"; do
    IFS='|' read -r label ranks procs flags <<< "$entry"
    flags=${flags//HALF/$((L / 4))}
    read -r -a extra <<< "$flags $(defaults "$flags" "$model_flags")"
    tag="$name-$(echo "$label" | tr -c 'a-z0-9' '_')"
    threads=$THREADS
    (( procs > 1 )) && threads=$(( THREADS / procs > 0 ? THREADS / procs : 1 ))
    echo "== $name, $label" >&2
    # Three plans, each measuring this host on the spot (about a second): the median prediction, as
    # the measured time is the median of iterations (a second's measurement on a shared 2-core
    # machine moved a prediction by up to 38%).
    for k in 1 2 3; do
      "$troupe" plan "${base[@]}" "${extra[@]}" --num-threads "$threads" --gpu cpu --gpus-per-node "$ranks" --json --top 50 \
        > "$work/$tag.plan$k.json" 2> "$work/$tag.plan.err" || { cat "$work/$tag.plan.err" >&2; exit 1; }
    done
    train=("$troupe" train "${base[@]}" "${extra[@]}" --mock-data --train-iters "$ITERS" --log-interval 1
           --eval-interval 100000 --eval-iters 0 --num-threads "$threads")
    # The plan of the process (one process: all its ranks; under launch each process is one rank,
    # whose figure the plan's JSON gives).
    if (( procs == 1 )); then
      "${train[@]}" --dry-run > "$work/$tag.dry" 2> "$work/$tag.dry.err" || { cat "$work/$tag.dry" "$work/$tag.dry.err" >&2; exit 1; }
    else
      : > "$work/$tag.dry"
    fi
    if (( procs > 1 )); then
      "$troupe" launch --nproc-per-node "$procs" --log-dir "$work/$tag.logs" -- train "${base[@]}" "${extra[@]}" \
        --mock-data --train-iters "$ITERS" --log-interval 1 --eval-interval 100000 --eval-iters 0 --num-threads "$threads" \
        --metrics-file "$work/$tag.jsonl" > "$work/$tag.log" 2> "$work/$tag.err" \
        || { cat "$work/$tag.log" "$work/$tag.err" >&2; exit 1; }
    else
      "${train[@]}" --metrics-file "$work/$tag.jsonl" > "$work/$tag.log" 2> "$work/$tag.err" \
        || { cat "$work/$tag.log" "$work/$tag.err" >&2; exit 1; }
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$label" "$ranks" "$procs" "$tag" >> "$work/rows.tsv"
  done
done

python3 - "$work" "$ITERS" "$THREADS" "${OUT:-}" <<'PY'
import glob, json, os, re, statistics, sys
work, iters, threads, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def measured_growth(tag):
    # What the ranks added to the process: troupe's own peak (getrusage of the process, printed at the
    # end) less what it held before the ranks allocated anything (its note at the start), both from
    # rank 0's process log. GNU time's figure is not used: it also counts the process's teardown
    # after the peak it reports itself (about 60 MiB more for any troupe command).
    text = open(f"{work}/{tag}.log").read()
    peak = re.findall(r"peak resident memory of this process: ([\d.]+) MiB", text)
    base = re.findall(r"resident before the ranks: (\d+) MiB", text)
    return float(peak[-1]) - float(base[0]) if peak and base else float("nan")

rows = []
for line in open(f"{work}/rows.tsv"):
    name, label, ranks, procs, tag = line.rstrip("\n").split("\t")
    ranks, procs = int(ranks), int(procs)
    plans = []
    for k in (1, 2, 3):
        layouts = json.load(open(f"{work}/{tag}.plan{k}.json"))["layouts"]
        plans.append([l for l in layouts if not l["sequence_parallel"]][0])
    plan = sorted(plans, key=lambda l: l["iteration_seconds"])[1]  # the median of the three
    train = [json.loads(l) for l in open(f"{work}/{tag}.jsonl") if l.strip()]
    train = [j for j in train if j.get("type") == "train"]
    measured_s = statistics.median(j["ms_per_iter"] for j in train[2:]) / 1e3
    dry = open(f"{work}/{tag}.dry").read()
    m = re.search(r"this process: ([\d.]+) ([MG])iB", dry)
    planned_process = float(m.group(1)) * (1024 if m.group(2) == "G" else 1) if m else float("nan")
    per_rank = plan["memory_per_rank_bytes"] / 2**20
    predicted_mib = per_rank if procs > 1 else planned_process
    measured_mib = measured_growth(tag)
    rows.append(dict(model=name, layout=label, ranks=ranks, procs=procs, predicted_s=plan["iteration_seconds"],
                     measured_s=measured_s, predicted_mib=predicted_mib, measured_mib=measured_mib,
                     plan_per_rank_mib=per_rank))

lines = ["# troupe plan against measured runs on this machine", "",
         f"- {os.cpu_count()} logical CPUs; --num-threads {threads} per process; {iters} iterations per run, the median "
         "of iterations 3.. measured", "- predicted: `troupe plan --gpu cpu --gpus-per-node RANKS` with every size fixed "
         "(profile troupe), the median of three plans; memory: the process's peak resident memory less what it held before its ranks allocated "
         "anything (both from its log), against the plan's memory of the process", "",
         "| model | layout | ranks | processes | predicted s/iter | measured s/iter | time error | predicted MiB | measured MiB | memory error |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
ok_time = ok_mem = 0
for r in rows:
    te = r["predicted_s"] / r["measured_s"] - 1
    me = r["predicted_mib"] / r["measured_mib"] - 1 if r["measured_mib"] > 0 else float("nan")
    ok_time += abs(te) <= 0.15
    ok_mem += abs(me) <= 0.10
    lines.append(f"| {r['model']} | {r['layout']} | {r['ranks']} | {r['procs']} | {r['predicted_s']:.4f} | "
                 f"{r['measured_s']:.4f} | {100 * te:+.1f}% | {r['predicted_mib']:.1f} | {r['measured_mib']:.1f} | {100 * me:+.1f}% |")
lines.append("")
lines.append(f"within 15% of the measured time: {ok_time} of {len(rows)}; within 10% of the measured memory: {ok_mem} of {len(rows)}")
for model in sorted({r["model"] for r in rows}):
    rs = [r for r in rows if r["model"] == model]
    by_pred = [r["layout"] for r in sorted(rs, key=lambda r: r["predicted_s"])][:3]
    by_meas = [r["layout"] for r in sorted(rs, key=lambda r: r["measured_s"])][:3]
    lines.append(f"{model}: predicted best three {by_pred}; measured {by_meas}: {'same order' if by_pred == by_meas else 'differ'}")
    # What a user loses by taking the plan's choice: its measured time against the measured best's,
    # and how far apart the measured best three are (closer than a run's repeat, their order is noise).
    best = min(r["measured_s"] for r in rs)
    chosen = {r["layout"]: r["measured_s"] for r in rs}
    third = sorted(r["measured_s"] for r in rs)[min(2, len(rs) - 1)]
    lines.append(f"{model}: the predicted best runs {100 * (chosen[by_pred[0]] / best - 1):.1f}% slower than the measured "
                 f"best; the predicted best three {', '.join(f'{100 * (chosen[l] / best - 1):+.1f}%' for l in by_pred)}; "
                 f"the measured best three lie within {100 * (third / best - 1):.1f}%")
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
