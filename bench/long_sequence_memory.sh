#!/usr/bin/env bash
# Peak memory of long sequences under context parallelism (issue 29, item 4), fp32, CPU, one process.
#
# Table mode (default): for each sequence length SEQ (default 8192 16384 32768), each context-parallel size (--cp,
# default "1 2 4"; the cp ranks are threads of the one process) and each recompute granularity (--recompute, default
# "none full"), trains --train-iters iterations (default 2) of a GPT-2 (4 layers, hidden 512, 8 heads, vocabulary 512,
# micro-batch 1, global batch 1, mock data, no dropout) and records the process's peak resident memory (GNU time's
# "Maximum resident set size"; troupe's own "peak resident memory of this process" line beside it) against the plan
# `troupe train ... --dry-run` prints ("this process: X over N rank(s)", and "expected peak of this process: Y", the plan
# and what the process holds already: binary, libraries, allocator). Prints a Markdown table: seq, cp, recompute,
# measured peak MiB, planned MiB, expected peak MiB, measured / expected; the notes give the dry run's own peak.
#
# --longest: searches, for cp 1 and cp 4 (--cp to change) with --recompute-granularity full, the longest sequence that
# trains 1 iteration under the memory limit: doubling from --start (default 4096), then bisecting to a multiple of the
# granule (--granule, default 2 x cp x 64). A try fails when it exits non-zero, goes over --mem-limit or runs past --time-limit. With --torch the
# same search runs bench/torch_long_sequence.py (PyTorch, the same model, one process) under the same limits.
#
# Every run is under the memory limit (default 22G) and the time limit (default 1800 s), by bench/limited_run.py:
# systemd-run --scope -p MemoryMax when a systemd manager answers, else a watchdog that samples the resident memory of
# the process tree and kills it above the limit (--limit-method prlimit: RLIMIT_AS, which counts address space, not
# memory). troupe's own start-up memory check is switched off (TROUPE_MEMORY_CHECK=off) so that the limit decides,
# unless --troupe-memory-check is given. A table run whose plan is already over the limit is skipped (listed as
# such) unless --run-over-plan: it could not fit, and driving the machine to the limit risks the kernel's OOM killer.
#
# Usage: bench/long_sequence_memory.sh [options] [SEQ ...]
#        bench/long_sequence_memory.sh --longest [--torch] [options]
# Options: --cp "1 2 4"  --ulysses (the sizes as --ds-sequence-parallel-size: DeepSpeed-Ulysses' all-to-all)
#          --recompute "none full"  --train-iters 2  --threads N (default: all cores)
#          --num-layers 4  --hidden-size 512  --num-attention-heads 8  --vocab-size 512  --dropout 0
#          --mem-limit 22G  --time-limit 1800  --limit-method auto|systemd|watch|prlimit|none
#          --start 4096  --max-seq N  --granule N (--longest; default 2 x cp x 64)   --torch  (--longest: also PyTorch)
#          --scratch DIR (default: a new mktemp -d directory, kept)  --out FILE (also write the table there)
#          --troupe-memory-check (leave troupe's start-up check on)  --run-over-plan (do not skip those runs)
# Environment: TROUPE_BIN (default build/bin/troupe), PYTHON (default /usr/bin/python3; Debian's, with torch, for
# --torch; the rest needs only the standard library).
# Full size, e.g.: nice bash bench/long_sequence_memory.sh --out bench/results/long_sequence_memory.md
#                  nice bash bench/long_sequence_memory.sh --longest --torch --out bench/results/longest_sequence.md
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

seqs=()
cps=""
cp_flag=--context-parallel-size
recomputes="none full"
iters=2
threads="$(nproc 2>/dev/null || echo 1)"
layers=4
hidden=512
heads=8
vocab=512
dropout=0
mem_limit=22G
time_limit=1800
limit_method=auto
start=4096
max_seq=""
granule_opt=""
longest=0
with_torch=0
scratch=""
out=""
memory_check=0
run_over_plan=0

usage() { sed -n '2,37p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
need() { [[ $# -ge 2 ]] || { echo "long_sequence_memory.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cp) need "$@"; cps="$2"; shift 2 ;;
    --ulysses) cp_flag=--ds-sequence-parallel-size; shift ;;
    --recompute) need "$@"; recomputes="$2"; shift 2 ;;
    --train-iters) need "$@"; iters="$2"; shift 2 ;;
    --threads) need "$@"; threads="$2"; shift 2 ;;
    --num-layers) need "$@"; layers="$2"; shift 2 ;;
    --hidden-size) need "$@"; hidden="$2"; shift 2 ;;
    --num-attention-heads) need "$@"; heads="$2"; shift 2 ;;
    --vocab-size) need "$@"; vocab="$2"; shift 2 ;;
    --dropout) need "$@"; dropout="$2"; shift 2 ;;
    --mem-limit) need "$@"; mem_limit="$2"; shift 2 ;;
    --time-limit) need "$@"; time_limit="$2"; shift 2 ;;
    --limit-method) need "$@"; limit_method="$2"; shift 2 ;;
    --start) need "$@"; start="$2"; shift 2 ;;
    --max-seq) need "$@"; max_seq="$2"; shift 2 ;;
    --granule) need "$@"; granule_opt="$2"; shift 2 ;;
    --scratch) need "$@"; scratch="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --longest) longest=1; shift ;;
    --torch) with_torch=1; shift ;;
    --troupe-memory-check) memory_check=1; shift ;;
    --run-over-plan) run_over_plan=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "long_sequence_memory.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) seqs+=("$1"); shift ;;
  esac
done
[[ ${#seqs[@]} -gt 0 ]] || seqs=(8192 16384 32768)
if [[ -z "$cps" ]]; then
  if [[ $longest == 1 ]]; then cps="1 4"; else cps="1 2 4"; fi
fi
read -r -a cp_list <<<"$cps"
read -r -a recompute_list <<<"$recomputes"
for v in "${seqs[@]}" "${cp_list[@]}" "$iters" "$threads" "$layers" "$hidden" "$heads" "$vocab" "$start" ${max_seq:+"$max_seq"}; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "long_sequence_memory.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
for r in "${recompute_list[@]}"; do
  case "$r" in none|selective|full) ;; *) echo "long_sequence_memory.sh: --recompute takes none, selective, full; got '$r'" >&2; exit 2 ;; esac
done
[[ $with_torch == 0 || $longest == 1 ]] || { echo "long_sequence_memory.sh: --torch goes with --longest" >&2; exit 2; }

TROUPE_BIN="${TROUPE_BIN:-$root/build/bin/troupe}"
PYTHON="${PYTHON:-/usr/bin/python3}"
[[ -x "$TROUPE_BIN" ]] || { echo "long_sequence_memory.sh: troupe binary '$TROUPE_BIN' not found (build it, or set TROUPE_BIN)" >&2; exit 1; }
[[ -x /usr/bin/time ]] || echo "long_sequence_memory.sh: /usr/bin/time missing: the measured peak is troupe's own line" >&2
if [[ $with_torch == 1 ]] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "long_sequence_memory.sh: '$PYTHON' cannot import torch (set PYTHON to Debian's /usr/bin/python3)" >&2
  exit 1
fi
limited=("$PYTHON" "$here/limited_run.py")
# Checks the size and resolves "auto" once, so every run uses the same method.
mem_bytes="$("$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import limited_run as l; print(l.parse_size(sys.argv[2]))' "$here" "$mem_limit")" \
  || { echo "long_sequence_memory.sh: --mem-limit '$mem_limit' is not a size (22G, 512M, bytes)" >&2; exit 2; }
method="$("$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import limited_run as l; print(l.resolve_method(sys.argv[2]))' "$here" "$limit_method")"
limits=(--mem-limit "$mem_bytes" --time-limit "$time_limit" --method "$method")

if [[ -z "$scratch" ]]; then
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/long_sequence_memory.XXXXXX")"
else
  mkdir -p "$scratch"
fi
scratch="$(cd "$scratch" && pwd)"
echo "== long_sequence_memory.sh: $TROUPE_BIN, files in $scratch; memory limit $mem_limit ($method), $time_limit s per run" >&2
[[ $memory_check == 1 ]] || export TROUPE_MEMORY_CHECK=off

model=(--num-layers "$layers" --hidden-size "$hidden" --num-attention-heads "$heads" --micro-batch-size 1
       --global-batch-size 1 --mock-data --tokenizer-type NullTokenizer --vocab-size "$vocab"
       --hidden-dropout "$dropout" --attention-dropout "$dropout" --num-threads "$threads" --log-interval 1
       --distributed-timeout-minutes "$(( time_limit / 60 + 1 ))")  # an iteration may take longer than the default 10
timed=()
[[ -x /usr/bin/time ]] && timed=(/usr/bin/time -v)

# plan TAG SEQ CP RECOMPUTE: the dry run's plan (TAG.plan) and its own peak (GNU time, TAG.plan.err)
plan() {
  timeout 600 ${timed[@]+"${timed[@]}"} "$TROUPE_BIN" train "${model[@]}" --seq-length "$2" "$cp_flag" "$3" \
    --recompute-granularity "$4" --train-iters 1 --dry-run >"$scratch/$1.plan" 2>"$scratch/$1.plan.err" \
    || echo "long_sequence_memory.sh: the dry run of $1 failed (see $scratch/$1.plan.err)" >&2
}

manifest="$scratch/manifest.tsv"
: >"$manifest"
if [[ $longest == 0 ]]; then
  total=$(( ${#seqs[@]} * ${#cp_list[@]} * ${#recompute_list[@]} ))
  n=0
  for seq in "${seqs[@]}"; do
    for cp in "${cp_list[@]}"; do
      for rc in "${recompute_list[@]}"; do
        n=$((n + 1))
        tag="seq${seq}-cp${cp}-${rc}"
        if (( seq % (2 * cp) != 0 )); then
          echo "== [$n/$total] seq $seq, cp $cp: skipped (2 x cp must divide the sequence)" >&2
          continue
        fi
        plan "$tag" "$seq" "$cp" "$rc"
        echo "== [$n/$total] seq $seq, cp $cp, recompute $rc: $(grep -m1 -o 'this process: .*' "$scratch/$tag.plan" || echo 'no plan') planned" >&2
        rm -f "$scratch/$tag.metrics.jsonl" "$scratch/$tag.skipped"
        planned_bytes="$(sed -n 's/.*this process: \([0-9.]*\) \([MGT]\)iB over.*/\1 \2/p' "$scratch/$tag.plan" | head -1 |
          awk '{ printf "%.0f", $1 * ($2 == "M" ? 2^20 : $2 == "G" ? 2^30 : 2^40) }')"
        if [[ $run_over_plan == 0 && -n "$planned_bytes" ]] && (( planned_bytes > mem_bytes )); then
          echo "   skipped: the plan is over the memory limit (--run-over-plan runs it anyway)" >&2
          : >"$scratch/$tag.skipped"
          printf '%s\t%s\t%s\t%s\n' "$seq" "$cp" "$rc" "$tag" >>"$manifest"
          continue
        fi
        "${limited[@]}" run "${limits[@]}" --stdout "$scratch/$tag.out" --stderr "$scratch/$tag.err" \
          --report "$scratch/$tag.json" -- ${timed[@]+"${timed[@]}"} "$TROUPE_BIN" train "${model[@]}" \
          --seq-length "$seq" "$cp_flag" "$cp" --recompute-granularity "$rc" --train-iters "$iters" \
          --metrics-file "$scratch/$tag.metrics.jsonl" || true
        echo "   $("$PYTHON" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%s in %.1f s, sampled peak %.0f MiB" % (r["status"], r["wall_s"], r["peak_tree_rss_mib"]))' "$scratch/$tag.json")" >&2
        printf '%s\t%s\t%s\t%s\n' "$seq" "$cp" "$rc" "$tag" >>"$manifest"
      done
    done
  done
else
  for cp in "${cp_list[@]}"; do
    granule=${granule_opt:-$((2 * cp * 64))}
    if (( granule % (2 * cp) != 0 )); then
      echo "long_sequence_memory.sh: --granule $granule is not a multiple of 2 x cp = $((2 * cp)) (take a multiple of $((2 * cp * 64)))" >&2
      exit 2
    fi
    echo "== longest sequence at cp $cp, recompute full (granule $granule, from $start${max_seq:+, at most $max_seq})" >&2
    "${limited[@]}" longest "${limits[@]}" --granule "$granule" --start "$start" ${max_seq:+--max-seq "$max_seq"} \
      --log-dir "$scratch/longest-cp$cp" --report "$scratch/longest-cp$cp.json" -- "$TROUPE_BIN" train "${model[@]}" \
      --seq-length '{seq}' "$cp_flag" "$cp" --recompute-granularity full --train-iters 1 >/dev/null
    best="$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["longest"] or "")' "$scratch/longest-cp$cp.json")"
    [[ -z "$best" ]] || plan "longest-cp$cp" "$best" "$cp" full
    printf '%s\t%s\t%s\t%s\n' troupe "$cp" full "longest-cp$cp" >>"$manifest"
  done
  if [[ $with_torch == 1 ]]; then
    echo "== longest sequence, PyTorch (bench/torch_long_sequence.py)" >&2
    "$PYTHON" "$here/torch_long_sequence.py" --longest --json --num-layers "$layers" --hidden-size "$hidden" \
      --num-attention-heads "$heads" --vocab-size "$vocab" --dropout "$dropout" --threads "$threads" \
      --start "$start" --granule 128 ${max_seq:+--max-seq "$max_seq"} --mem-limit "$mem_bytes" \
      --time-limit "$time_limit" --limit-method "$method" --scratch "$scratch/longest-torch" >"$scratch/longest-torch.json"
    printf '%s\t%s\t%s\t%s\n' pytorch 1 none longest-torch >>"$manifest"
  fi
fi

cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || true)"
"$PYTHON" - "$scratch" "$longest" "${out:-}" "${cpu:-unknown CPU}" "$(nproc 2>/dev/null || echo '?')" "$threads" \
  "$layers" "$hidden" "$heads" "$vocab" "$dropout" "$iters" "$mem_limit" "$method" "$time_limit" "$TROUPE_BIN" "$cp_flag" <<'EOF'
import datetime, json, os, re, sys

(scratch, longest, out, cpu, ncpu, threads, layers, hidden, heads, vocab, dropout, iters, mem_limit, method,
 time_limit, binary, cp_flag) = sys.argv[1:18]
longest = longest == "1"

def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""

def planned_mib(tag):
    m = re.search(r"this process: ([0-9.]+) (MiB|GiB|TiB) over (\d+) rank", read(os.path.join(scratch, tag + ".plan")))
    if not m:
        return None
    return float(m.group(1)) * {"MiB": 1, "GiB": 1024, "TiB": 1024 * 1024}[m.group(2)]

def expected_mib(tag):
    m = re.search(r"expected peak of this process: ([0-9.]+) (MiB|GiB|TiB)", read(os.path.join(scratch, tag + ".plan")))
    if not m:
        return None
    return float(m.group(1)) * {"MiB": 1, "GiB": 1024, "TiB": 1024 * 1024}[m.group(2)]

def time_peak_mib(text):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return int(m.group(1)) / 1024 if m else None

def troupe_peak_mib(text):
    m = re.search(r"peak resident memory of this process: ([0-9.]+) MiB", text)
    return float(m.group(1)) if m else None

def fmt(v, spec=",.0f"):
    return "–" if v is None else format(v, spec)

manifest = [l.rstrip("\n").split("\t") for l in open(os.path.join(scratch, "manifest.tsv")) if l.strip()]
limit_text = f"{mem_limit} ({method}), {float(time_limit):.0f} s per run"
lines = [
    "# troupe: " + ("longest sequence that trains under a memory limit" if longest else
                    "peak memory of long sequences with context parallelism") + " (fp32, CPU, one process)",
    "",
    f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
    f"- machine: {cpu}, {ncpu} logical CPUs; --num-threads {threads} (the process's threads, split over its cp ranks)",
    f"- model: GPT-2, {layers} layers, hidden {hidden}, {heads} heads, vocabulary {vocab}, learned positions as long "
    f"as the sequence, micro-batch 1, global batch 1, mock data, dropout {dropout}, AdamW",
    f"- limits: {limit_text}; troupe: {binary}",
    f"- cp: troupe's {cp_flag}" + (" (DeepSpeed-Ulysses: all-to-all attention)" if "ds-sequence" in cp_flag else
                                    " (ring attention, p2p)"),
]
bases = []
if not longest:
    lines[-1:-1] = [f"- {iters} training iterations per run"]
    lines += ["", "| seq | cp | recompute | measured peak MiB | planned MiB | expected peak MiB | "
              "measured / expected | troupe's peak MiB | s/iter (last) | status |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for seq, cp, rc, tag in manifest:
        rep = json.loads(read(os.path.join(scratch, tag + ".json")) or "{}")
        err, outt = read(os.path.join(scratch, tag + ".err")), read(os.path.join(scratch, tag + ".out"))
        status = rep.get("status", "not run")
        if os.path.exists(os.path.join(scratch, tag + ".skipped")):
            status = "skipped: planned over the limit"
        measured = time_peak_mib(err)
        own = troupe_peak_mib(outt)
        if measured is None and status == "ok":
            measured = own
        plan = planned_mib(tag)
        base = time_peak_mib(read(os.path.join(scratch, tag + ".plan.err")))
        if base is not None:
            bases.append(base)
        ms = None
        for l in read(os.path.join(scratch, tag + ".metrics.jsonl")).splitlines():
            try:
                rec = json.loads(l)
            except ValueError:
                continue
            if rec.get("type", "train") == "train" and "ms_per_iter" in rec:
                ms = rec["ms_per_iter"]
        if status == "over_memory":
            status = f"over the limit (sampled {rep.get('peak_tree_rss_mib', 0):,.0f} MiB)"
            measured = None
        elif status == "timeout":
            status = f"time limit ({rep.get('wall_s', 0):.0f} s)"
        elif status == "failed":
            status = f"failed (exit {rep.get('rc')})"
        expected = expected_mib(tag)
        ratio = measured / expected if measured is not None and expected else None
        lines.append(f"| {seq} | {cp} | {rc} | {fmt(measured)} | {fmt(plan)} | {fmt(expected)} | {fmt(ratio, '.2f')} | "
                     f"{fmt(own)} | {fmt(None if ms is None else ms / 1000, '.2f')} | {status} |")
    lines += ["", "measured: GNU time's maximum resident set size of the process; planned: the `--dry-run` plan's "
              "\"this process\" line (weights, gradients, Adam moments and activations of its ranks); expected: its "
              "\"expected peak of this process\" line (the plan and what the dry-run process held already); "
              "troupe's peak: its own getrusage line at the end of the run."]
    if bases:
        lines.append(f"base: the peak of that configuration's `--dry-run` process ({min(bases):,.0f}-{max(bases):,.0f} "
                     "MiB here: binary, libraries, allocator, nothing of the plan), which every measured peak includes.")
else:
    lines += ["", "| implementation | cp | recompute | longest sequence | peak MiB there | planned MiB there | "
              "shortest failure | why | tries |", "|---|---:|---|---:|---:|---:|---:|---|---:|"]
    for impl, cp, rc, tag in manifest:
        res = json.loads(read(os.path.join(scratch, tag + ".json")) or "{}")
        best, fail, capped = res.get("longest"), res.get("first_failure"), res.get("capped")
        if impl == "troupe":
            peak = troupe_peak_mib(read(os.path.join(scratch, tag, f"try-{best}.out"))) if best else None
            plan = planned_mib(tag) if best else None
            name = "troupe"
        else:
            peak, plan = res.get("peak_rss_mib"), None
            m = re.search(r"\(PyTorch (\S+),", read(os.path.join(scratch, tag, f"try-{best}.out")) if best else "")
            name = "PyTorch" + (f" {m.group(1)}" if m else "")
        f = res.get("failure") or {}
        why = ("none up to --max-seq" if capped else
               {"over_memory": "over the memory limit", "timeout": "time limit",
                "failed": f"exit {f.get('rc')}"}.get(f.get("status"), f.get("status", "–")))
        lines.append(f"| {name} | {cp} | {rc} | {'≥ ' if capped else ''}{fmt(best)} | {fmt(peak)} | {fmt(plan)} | "
                     f"{fmt(fail)} | {why} | {len(res.get('tries', []))} |")
    lines += ["", "A try trains 1 iteration; doubling from the start, then bisecting to a multiple of 2 x cp x 64 "
              "(PyTorch: 128). peak: the process's own getrusage line at the longest sequence that passed; planned: "
              "troupe's `--dry-run` plan there. Every try's logs: " + scratch + "/longest-*/."]
text = "\n".join(lines) + "\n"
if out:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
print(text, end="")
EOF
[[ -z "$out" ]] || echo "(written to $out)" >&2
echo "(runs' files in $scratch)" >&2
