#!/usr/bin/env bash
# `troupe serve` under load: GPT-2 124M fp32 (a one-iteration troupe checkpoint with the GPT-2 BPE
# vocabulary), the server on --threads compute threads, 1, 4 and 16 clients at once
# (bench/serve_load.py: each sends streamed greedy completions of up to --tokens tokens one after
# the other). Per level: generated tokens/s over the run, requests/s, latency and time-to-first-token
# percentiles (p50, p90, p99). The peer, in the same run and on the same threads: `troupe generate`
# with as many prompts as clients, its tokens per second from the prompts fed to the last token (the
# batch the server could at best keep running; the median of 3); the ratio is what the server keeps of it through
# HTTP, streaming and continuous batching.
# Each level runs --repeat times; the run of median tokens/s is reported (its percentiles too).
#   bench/serve_load.sh [--threads 2] [--tokens 32] [--repeat 3] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 TOKENS=32 OUT="" REPEAT=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "serve_load.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="$(pwd)/${TROUPE_BIN:-build/bin/troupe}"
[[ -x "$troupe" ]] || { echo "serve_load.sh: no troupe at $troupe" >&2; exit 1; }
[[ -s .deps/gpt2/encoder.json ]] || { echo "serve_load.sh: no GPT-2 BPE files in .deps/gpt2 (scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/troupe-serveload.XXXXXX)
serve_pid=""
trap '[[ -n "$serve_pid" ]] && kill "$serve_pid" 2> /dev/null; rm -rf "$work"' EXIT
src=$(pwd)

"$troupe" train --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 64 --max-position-embeddings 1024 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$src/.deps/gpt2/encoder.json" --merge-file "$src/.deps/gpt2/vocab.bpe" \
  --mock-data --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-4 --save "$work/ck" \
  --num-threads "$THREADS" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }

"$troupe" serve --load "$work/ck" --port 0 --num-threads "$THREADS" --http-threads 32 > "$work/serve.log" 2>&1 &
serve_pid=$!
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*:\([0-9]*\) (PUT \/api.*/\1/p' "$work/serve.log")
  [[ -n "$port" ]] && break
  sleep 0.1
done
[[ -n "$port" ]] || { cat "$work/serve.log"; echo "serve_load.sh: the server did not start" >&2; exit 1; }

/usr/bin/python3 - "$troupe" "$work" "$THREADS" "$TOKENS" "$port" "$src" "${OUT:-}" "$REPEAT" <<'PY'
import json, re, subprocess, sys
troupe, work, threads, tokens, port, src, out, repeat = sys.argv[1:9]
prompt = "The history of the city begins in the early years of the settlement"
rows = []
for clients, requests in ((1, 6), (4, 3), (16, 2)):
    runs = []
    for _ in range(int(repeat)):
        load = subprocess.run([sys.executable, f"{src}/bench/serve_load.py", "--port", port, "--clients", str(clients),
                               "--requests", str(requests), "--tokens", tokens, "--prompt", prompt],
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(load.stdout))
    s = sorted(runs, key=lambda r: r["tokens_per_second"])[len(runs) // 2]
    rates = []
    for _ in range(3):  # the median of three
        g = subprocess.run([troupe, "generate", "--load", f"{work}/ck", "--tokens-to-generate", tokens, "--top-k", "1",
                            "--timing", "--num-threads", threads] + ["--prompt", prompt] * clients,
                           capture_output=True, text=True, check=True)
        m = re.search(r"prompts fed in ([0-9.]+) s .*?(\d+) tokens in ([0-9.]+) s", g.stderr)
        # tokens after the first ones, plus the first tokens the prompts gave
        rates.append((int(m.group(2)) + clients) / (float(m.group(1)) + float(m.group(3))))
    offline = sorted(rates)[1]
    rows.append((s, offline))
lines = [f"# troupe serve under load: GPT-2 124M fp32, {threads} threads, streamed greedy completions of up to {tokens} tokens, "
         f"the median of {repeat} runs", "",
         "| clients | requests | tokens/s | requests/s | latency p50 s | p90 | p99 | first token p50 s | p90 | p99 | troupe generate, same batch, tokens/s | kept |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for s, offline in rows:
    lines.append(f"| {s['clients']} | {s['requests']} | {s['tokens_per_second']:.1f} | {s['requests_per_second']:.2f} | "
                 f"{s['latency_p50']:.2f} | {s['latency_p90']:.2f} | {s['latency_p99']:.2f} | {s['ttft_p50']:.3f} | "
                 f"{s['ttft_p90']:.3f} | {s['ttft_p99']:.3f} | {offline:.1f} | {s['tokens_per_second'] / offline:.2f} |")
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
