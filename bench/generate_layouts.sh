#!/usr/bin/env bash
# Parallel and 16-bit decoding against the one fp32 decoder, in the same run: `troupe generate` of
# GPT-2 124M (12 layers, hidden 768, the GPT-2 BPE vocabulary; a one-iteration troupe checkpoint) on
# the same threads, at batch 1 and 16 (a 26-token prompt, 64 tokens generated greedily), for tp 2,
# pp 2, tp 2 x pp 2, --bf16 and --fp16 against 1 x 1 fp32: time to first token and decode tokens/s
# (batch x 63 decode steps over their time), medians of --repeat runs, and each layout's ratio to the
# one decoder's. The fp32 layouts must generate the one decoder's tokens (else the script fails).
#   bench/generate_layouts.sh [--threads 2] [--repeat 3] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 REPEAT=3 OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "generate_layouts.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="$(pwd)/${TROUPE_BIN:-build/bin/troupe}"
[[ -x "$troupe" ]] || { echo "generate_layouts.sh: no troupe at $troupe" >&2; exit 1; }
[[ -s .deps/gpt2/encoder.json ]] || { echo "generate_layouts.sh: no GPT-2 BPE files in .deps/gpt2 (scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/troupe-genlayouts.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$(pwd)
"$troupe" train --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 64 --max-position-embeddings 1024 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$src/.deps/gpt2/encoder.json" --merge-file "$src/.deps/gpt2/vocab.bpe" \
  --mock-data --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-4 --save "$work/ck" \
  --num-threads "$THREADS" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }

/usr/bin/python3 - "$troupe" "$work" "$THREADS" "$REPEAT" "${OUT:-}" <<'PY'
import json, re, statistics, subprocess, sys
troupe, work, threads, repeat, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
prompt = ("The history of the city begins in the early years of the settlement, when a small group of "
          "families arrived from the coast and built")
N = 64
layouts = [("1 x 1 fp32", []),
           ("tp 2", ["--tensor-model-parallel-size", "2"]),
           ("pp 2", ["--pipeline-model-parallel-size", "2"]),
           ("tp 2 x pp 2", ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
           ("1 x 1 bf16", ["--bf16"]),
           ("1 x 1 fp16", ["--fp16"])]
rows, base = [], {}
for B in (1, 16):
    for name, flags in layouts:
        ttft, rate, tokens = [], [], None
        for _ in range(repeat):
            cmd = [troupe, "generate", "--load", f"{work}/ck", "--tokens-to-generate", str(N), "--top-k", "1",
                   "--no-stop-on-eod", "--json", "--timing", "--num-threads", str(threads)] + flags + ["--prompt", prompt] * B
            r = subprocess.run(cmd, capture_output=True, text=True, check=True)
            m = re.search(r"prompts fed in ([0-9.]+) s .*?(\d+) tokens in ([0-9.]+) s", r.stderr)
            ttft.append(float(m.group(1)))
            rate.append(B * (N - 1) / float(m.group(3)))
            tokens = json.loads(r.stdout.splitlines()[0])["tokens"]
        if name == "1 x 1 fp32":
            base[B] = tokens
        elif not name.endswith(("bf16", "fp16")) and tokens != base[B]:
            sys.exit(f"{name} batch {B}: other tokens than the one decoder's:\n{tokens}\n{base[B]}")
        rows.append((name, B, statistics.median(ttft), statistics.median(rate)))
ref = {(B): (t, r) for name, B, t, r in rows if name == "1 x 1 fp32"}
lines = [f"# troupe generate, GPT-2 124M, {threads} threads, median of {repeat}: layouts and 16 bits against the one fp32 decoder", "",
         "| layout | batch | first token s | vs 1 x 1 | decode tokens/s | vs 1 x 1 |", "|---|---:|---:|---:|---:|---:|"]
for name, B, t, r in rows:
    lines.append(f"| {name} | {B} | {t:.3f} | {ref[B][0] / t:.2f}x | {r:.1f} | {r / ref[B][1]:.2f}x |")
lines += ["", "the fp32 layouts generate the one decoder's tokens"]
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
