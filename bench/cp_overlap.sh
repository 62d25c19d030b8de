#!/usr/bin/env bash
# How much of context parallelism's key/value traffic the attention hides, and what cp costs in tokens/s (issue 29,
# item 5), fp32, CPU.
#
# At one sequence length (default 16384) trains --iters iterations (default 4) of a GPT-2 (4 layers, hidden 512,
# 8 heads, vocabulary 512, micro-batch 1, global batch 1, mock data, no dropout) three ways:
#   cp 1, one process                               (the baseline's tokens/s)
#   cp N (default 2), one process: the N ranks are threads, the ring's messages go through shared memory
#   cp N, N processes under `troupe launch --nproc-per-node N`: one rank each, messages through UCX
# each with --timeline (a Chrome trace of the first 20 iterations) and --metrics-file. From the trace: transfer =
# the summed duration of the ring's spans ("cp ring K/V s/P, h.L" forward, "cp ring dK/dV s/P, h.L" backward: posted
# to completed), exposed = the summed duration of their "... (exposed)" spans (the part after the block's
# computation had finished), hidden fraction = 1 - exposed / transfer, over all ranks; the first iteration (page
# faults, first-touch) is left out unless --include-first. Other cp collectives ("cp all-gather" with --comm-type
# all_gather, "cp all-to-all" with a2a, where the binary has it) block and are listed apart. tokens/s: the median over the iterations after the first of the "train"
# records of --metrics-file. Prints a Markdown table.
#
# Threads: --threads T (default: all cores) is the job's total: one process gets --num-threads T (split over its
# ranks), each of N processes --num-threads max(1, T / N). --recompute (default selective) applies to all three: at
# cp 1 without recompute the attention probabilities of 4 layers at 16384 tokens are 32 GiB, selective keeps one
# layer's; at cp > 1 selective is the same as none (ring attention stores no probabilities).
# Every run is under bench/limited_run.py's memory limit (default 22G, the whole process tree) and time limit
# (default 1800 s); troupe's own start-up memory check is off (TROUPE_MEMORY_CHECK=off).
#
# Usage: bench/cp_overlap.sh [--seq 16384] [--cp 2] [--iters 4] [--recompute selective] [--comm-type p2p|all_gather|a2a]
#          [--threads N] [--num-layers 4] [--hidden-size 512] [--num-attention-heads 8] [--vocab-size 512]
#          [--dropout 0] [--include-first] [--mem-limit 22G] [--time-limit 1800]
#          [--limit-method auto|systemd|watch|prlimit|none] [--scratch DIR] [--out FILE]
# Environment: TROUPE_BIN (default build/bin/troupe), PYTHON (default /usr/bin/python3; standard library only).
# Full size: nice bash bench/cp_overlap.sh --out bench/results/cp_overlap.md
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

seq=16384
cp=2
iters=4
recompute=selective
comm_type=p2p
threads="$(nproc 2>/dev/null || echo 1)"
layers=4
hidden=512
heads=8
vocab=512
dropout=0
include_first=0
mem_limit=22G
time_limit=1800
limit_method=auto
scratch=""
out=""

usage() { sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
need() { [[ $# -ge 2 ]] || { echo "cp_overlap.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seq) need "$@"; seq="$2"; shift 2 ;;
    --cp) need "$@"; cp="$2"; shift 2 ;;
    --iters) need "$@"; iters="$2"; shift 2 ;;
    --recompute) need "$@"; recompute="$2"; shift 2 ;;
    --comm-type) need "$@"; comm_type="$2"; shift 2 ;;
    --threads) need "$@"; threads="$2"; shift 2 ;;
    --num-layers) need "$@"; layers="$2"; shift 2 ;;
    --hidden-size) need "$@"; hidden="$2"; shift 2 ;;
    --num-attention-heads) need "$@"; heads="$2"; shift 2 ;;
    --vocab-size) need "$@"; vocab="$2"; shift 2 ;;
    --dropout) need "$@"; dropout="$2"; shift 2 ;;
    --include-first) include_first=1; shift ;;
    --mem-limit) need "$@"; mem_limit="$2"; shift 2 ;;
    --time-limit) need "$@"; time_limit="$2"; shift 2 ;;
    --limit-method) need "$@"; limit_method="$2"; shift 2 ;;
    --scratch) need "$@"; scratch="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "cp_overlap.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in "$seq" "$cp" "$iters" "$threads" "$layers" "$hidden" "$heads" "$vocab"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "cp_overlap.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
(( cp >= 2 )) || { echo "cp_overlap.sh: --cp must be at least 2" >&2; exit 2; }
(( seq % (2 * cp) == 0 )) || { echo "cp_overlap.sh: 2 x --cp ($((2 * cp))) must divide --seq ($seq)" >&2; exit 2; }
case "$recompute" in none|selective|full) ;; *) echo "cp_overlap.sh: --recompute takes none, selective or full" >&2; exit 2 ;; esac
case "$comm_type" in p2p|all_gather|a2a) ;; *) echo "cp_overlap.sh: --comm-type takes p2p, all_gather or a2a" >&2; exit 2 ;; esac

TROUPE_BIN="${TROUPE_BIN:-$root/build/bin/troupe}"
PYTHON="${PYTHON:-/usr/bin/python3}"
[[ -x "$TROUPE_BIN" ]] || { echo "cp_overlap.sh: troupe binary '$TROUPE_BIN' not found (build it, or set TROUPE_BIN)" >&2; exit 1; }
mem_bytes="$("$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import limited_run as l; print(l.parse_size(sys.argv[2]))' "$here" "$mem_limit")" \
  || { echo "cp_overlap.sh: --mem-limit '$mem_limit' is not a size (22G, 512M, bytes)" >&2; exit 2; }
method="$("$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import limited_run as l; print(l.resolve_method(sys.argv[2]))' "$here" "$limit_method")"

if [[ -z "$scratch" ]]; then
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/cp_overlap.XXXXXX")"
else
  mkdir -p "$scratch"
fi
scratch="$(cd "$scratch" && pwd)"
export TROUPE_MEMORY_CHECK=off
echo "== cp_overlap.sh: $TROUPE_BIN, seq $seq, cp $cp ($comm_type), $iters iterations, files in $scratch; limit $mem_limit ($method), $time_limit s per run" >&2

model=(--num-layers "$layers" --hidden-size "$hidden" --num-attention-heads "$heads" --seq-length "$seq"
       --micro-batch-size 1 --global-batch-size 1 --mock-data --tokenizer-type NullTokenizer --vocab-size "$vocab"
       --hidden-dropout "$dropout" --attention-dropout "$dropout" --recompute-granularity "$recompute"
       --train-iters "$iters" --log-interval 1)
per_proc=$(( threads / cp )); (( per_proc >= 1 )) || per_proc=1

# run NAME CMD...: one run under the limits, its files NAME.{out,err,json,trace.json,metrics.jsonl}
run() {
  local name="$1"; shift
  rm -f "$scratch/$name.trace.json" "$scratch/$name.metrics.jsonl"
  echo "== $name: $*" >&2
  "$PYTHON" "$here/limited_run.py" run --mem-limit "$mem_bytes" --time-limit "$time_limit" --method "$method" \
    --stdout "$scratch/$name.out" --stderr "$scratch/$name.err" --report "$scratch/$name.json" -- "$@" \
    --timeline "$scratch/$name.trace.json" --metrics-file "$scratch/$name.metrics.jsonl" || true
  echo "   $("$PYTHON" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%s in %.1f s, sampled peak %.0f MiB (all processes)" % (r["status"], r["wall_s"], r["peak_tree_rss_mib"]))' "$scratch/$name.json")" >&2
}

run cp1 "$TROUPE_BIN" train "${model[@]}" --context-parallel-size 1 --num-threads "$threads"
run "cp${cp}-1proc" "$TROUPE_BIN" train "${model[@]}" --context-parallel-size "$cp" --cp-comm-type "$comm_type" \
  --num-threads "$threads"
run "cp${cp}-${cp}proc" "$TROUPE_BIN" launch --nproc-per-node "$cp" -- train "${model[@]}" --context-parallel-size "$cp" \
  --cp-comm-type "$comm_type" --num-threads "$per_proc"

cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || true)"
"$PYTHON" - "$scratch" "$seq" "$cp" "$iters" "$recompute" "$comm_type" "$threads" "$per_proc" "$include_first" \
  "${out:-}" "${cpu:-unknown CPU}" "$(nproc 2>/dev/null || echo '?')" "$layers" "$hidden" "$heads" "$vocab" "$dropout" \
  "$TROUPE_BIN" <<'EOF'
import datetime, json, os, statistics, sys

(scratch, seq, cp, iters, recompute, comm_type, threads, per_proc, include_first, out, cpu, ncpu, layers, hidden,
 heads, vocab, dropout, binary) = sys.argv[1:19]
seq, cp, iters, include_first = int(seq), int(cp), int(iters), include_first == "1"

def load_json(path, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return default

def tokens_per_s(name):
    recs = []
    try:
        for line in open(os.path.join(scratch, name + ".metrics.jsonl"), encoding="utf-8"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type", "train") == "train" and "tokens_per_sec" in r:
                recs.append(r)
    except OSError:
        return None, 0
    recs.sort(key=lambda r: r.get("iteration", 0))
    counted = recs[1:] if len(recs) > 1 else recs
    return (statistics.median(r["tokens_per_sec"] for r in counted) if counted else None), len(counted)

def overlap(name):
    """Sums over the trace's spans (ms): ring transfer and exposed, forward (K/V) and backward (dK/dV) apart,
    and other cp collectives; the first iteration of each rank left out unless include_first."""
    trace = load_json(os.path.join(scratch, name + ".trace.json"))
    if trace is None:
        return None
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = [e for e in events if e.get("ph") == "X"]
    first_end = {}
    if not include_first:
        for e in spans:  # a rank's first optimizer span ends its first iteration
            if e.get("cat") == "optimizer":
                key = (e.get("pid"), e.get("tid"))
                end = e["ts"] + e.get("dur", 0)
                first_end[key] = min(first_end.get(key, end), end)
    s = dict(fwd=0.0, fwd_exp=0.0, bwd=0.0, bwd_exp=0.0, other=0.0, n=0, ranks=set())
    for e in spans:
        n = e.get("name", "")
        if not n.startswith("cp "):
            continue
        key = (e.get("pid"), e.get("tid"))
        if key in first_end and e["ts"] < first_end[key]:
            continue
        ms = e.get("dur", 0) / 1000.0
        s["ranks"].add(key)
        if n.startswith("cp ring "):
            part = "bwd" if n.startswith("cp ring dK/dV") else "fwd"
            if n.endswith("(exposed)"):
                s[part + "_exp"] += ms
            else:
                s[part] += ms
                s["n"] += 1
        elif not n.endswith("(exposed)"):
            s["other"] += ms
    return s

def fmt(v, spec=",.1f"):
    return "–" if v is None else format(v, spec)

def hidden_frac(transfer, exposed):
    return None if not transfer else 1.0 - exposed / transfer

counted_iters = max(1, min(iters, 20) - (0 if include_first else 1))
rows = [("cp 1", "1 process", "cp1", threads), (f"cp {cp}", "1 process", f"cp{cp}-1proc", threads),
        (f"cp {cp}", f"{cp} processes", f"cp{cp}-{cp}proc", f"{per_proc} each")]
base_tps, _ = tokens_per_s("cp1")
lines = [
    f"# troupe: context-parallel overlap and throughput, seq {seq}, cp {cp} ({comm_type}) (fp32, CPU)",
    "",
    f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
    f"- machine: {cpu}, {ncpu} logical CPUs; troupe: {binary}",
    f"- model: GPT-2, {layers} layers, hidden {hidden}, {heads} heads, vocabulary {vocab}, seq {seq}, micro-batch 1, "
    f"global batch 1, mock data, dropout {dropout}, recompute {recompute}, AdamW; {iters} iterations per run",
    f"- spans: " + ("every iteration in the trace" if include_first else
                    f"iterations 2-{min(iters, 20)} of the trace (the first left out)") +
    "; ms per iteration, summed over the ranks; tokens/s: median over iterations 2.." + str(iters),
    "",
    "| layout | processes | threads | status | tokens/s | vs cp 1 | K/V transfer ms/iter | exposed ms/iter | "
    "hidden fraction | forward (K/V) hidden | backward (dK/dV) hidden | other cp collectives ms/iter |",
    "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for layout, procs, name, thr in rows:
    rep = load_json(os.path.join(scratch, name + ".json"), {})
    status = rep.get("status", "not run")
    tps, _ = tokens_per_s(name)
    vs = tps / base_tps if tps and base_tps else None
    ov = overlap(name) if name != "cp1" else None
    if ov is not None and (ov["n"] or ov["other"]):
        transfer = ov["fwd"] + ov["bwd"]
        exposed = ov["fwd_exp"] + ov["bwd_exp"]
        cells = [fmt(transfer / counted_iters), fmt(exposed / counted_iters), fmt(hidden_frac(transfer, exposed), ".3f"),
                 fmt(hidden_frac(ov["fwd"], ov["fwd_exp"]), ".3f"), fmt(hidden_frac(ov["bwd"], ov["bwd_exp"]), ".3f"),
                 fmt(ov["other"] / counted_iters)]
    else:
        cells = ["–"] * 6
    lines.append(f"| {layout} | {procs} | {thr} | {status} | {fmt(tps, ',.0f')} | {fmt(vs, '.2f')} | " + " | ".join(cells) + " |")
lines += ["", "transfer: \"cp ring K/V|dK/dV s/P, h.L\" spans (posted to completed); exposed: their \"(exposed)\" spans "
          "(from the end of the block's computation to the transfer's completion); hidden = 1 - exposed / transfer. "
          "The backward's last hop (s = P) returns the gradient home with nothing left to compute, so it is exposed "
          "whole. Traces and logs: " + scratch + "."]
text = "\n".join(lines) + "\n"
if out:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
print(text, end="")
EOF
[[ -z "$out" ]] || echo "(written to $out)" >&2
