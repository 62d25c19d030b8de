#!/usr/bin/env bash
# Greedy decoding speed of `troupe generate` against PyTorch with a key/value cache
# (bench/torch_generate.py: float32, torch.no_grad(), attention as matrix products) on the same
# weights: GPT-2 124M, and a LLaMA of the same shape (12 layers, hidden 768, 12 heads in 4 query
# groups, SwiGLU 2048, RMSNorm, rope, no biases, untied head: 162M with the GPT-2 vocabulary) -- each
# a one-iteration troupe checkpoint with the GPT-2 BPE vocabulary, exported as a Hugging Face folder
# -- both on the same threads of this machine, in the same run: time to first token (the prompts fed)
# and decode tokens/s at batch 1 and 16 (a 26-token prompt, 64 tokens generated: 63 decode steps
# after the first token). Each figure is the median of --repeat runs; the generated tokens of both
# must agree (the first sequence's; else the script fails).
#   bench/generate_vs_pytorch.sh [--threads 2] [--repeat 3] [--models "gpt2 llama"] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 REPEAT=3 OUT="" MODELS="gpt2 llama"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "generate_vs_pytorch.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
troupe="$(pwd)/${TROUPE_BIN:-build/bin/troupe}"
[[ -x "$troupe" ]] || { echo "generate_vs_pytorch.sh: no troupe at $troupe" >&2; exit 1; }
[[ -s .deps/gpt2/encoder.json ]] || { echo "generate_vs_pytorch.sh: no GPT-2 BPE files in .deps/gpt2 (scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d /var/tmp/troupe-genbench.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$(pwd)

for model in $MODELS; do
  case $model in
    gpt2) flags=() ;;
    llama) flags=(--normalization RMSNorm --position-embedding-type rope --swiglu --disable-bias-linear
                  --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 4
                  --ffn-hidden-size 2048) ;;
    *) echo "generate_vs_pytorch.sh: --models takes gpt2 and llama, not $model" >&2; exit 2 ;;
  esac
  "$troupe" train --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 64 --max-position-embeddings 1024 \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$src/.deps/gpt2/encoder.json" --merge-file "$src/.deps/gpt2/vocab.bpe" \
    --mock-data --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-4 --save "$work/ck_$model" \
    --num-threads "$THREADS" "${flags[@]}" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
  "$troupe" ckpt export --load "$work/ck_$model" --format hf --output "$work/hf_$model" > /dev/null
done

/usr/bin/python3 - "$troupe" "$work" "$THREADS" "$REPEAT" "${OUT:-}" "$src" "$MODELS" <<'PY'
import json, re, statistics, subprocess, sys
troupe, work, threads, repeat, out, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
models = sys.argv[7].split()
prompt = ("The history of the city begins in the early years of the settlement, when a small group of "
          "families arrived from the coast and built")
N = 64
rows = []
for model, B in [(m, b) for m in models for b in (1, 16)]:
    t_ttft, t_rate, p_ttft, p_rate = [], [], [], []
    for _ in range(repeat):
        cmd = [troupe, "generate", "--load", f"{work}/ck_{model}", "--tokens-to-generate", str(N), "--top-k", "1",
               "--no-stop-on-eod", "--json", "--timing", "--num-threads", str(threads)] + ["--prompt", prompt] * B
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        m = re.search(r"prompts fed in ([0-9.]+) s .*?(\d+) tokens in ([0-9.]+) s", r.stderr)
        first = json.loads(r.stdout.splitlines()[0])
        ids = first["prompt_tokens"]
        t_ttft.append(float(m.group(1)))
        t_rate.append(B * (N - 1) / float(m.group(3)))
        p = subprocess.run([sys.executable, f"{src}/bench/torch_generate.py", "--hf-dir", f"{work}/hf_{model}", "--prompt-ids",
                            json.dumps(ids), "--batch", str(B), "--tokens", str(N), "--threads", str(threads)],
                           capture_output=True, text=True, check=True)
        pj = json.loads(p.stdout)
        if pj["generated"] != first["tokens"]:
            sys.exit(f"{model} batch {B}: PyTorch generated other tokens than troupe:\n{pj['generated']}\n{first['tokens']}")
        p_ttft.append(pj["prefill_seconds"])
        p_rate.append(pj["tokens_per_second"])
    tt, tr, pt, pr = (statistics.median(x) for x in (t_ttft, t_rate, p_ttft, p_rate))
    rows.append((model, B, len(ids), tt, pt, tr, pr))
names = {"gpt2": "GPT-2 124M", "llama": "LLaMA 162M (GPT-2's shape, GQA 12/4)"}
lines = [f"# troupe generate against PyTorch (KV cache, no_grad), fp32, {threads} threads, median of {repeat}", "",
         "| model | batch | prompt tokens | troupe first token s | PyTorch first token s | troupe decode tokens/s | PyTorch decode tokens/s | decode ratio |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
for model, B, n, tt, pt, tr, pr in rows:
    lines.append(f"| {names[model]} | {B} | {n} | {tt:.3f} | {pt:.3f} | {tr:.1f} | {pr:.1f} | {tr / pr:.2f}x |")
lines += ["", "the generated tokens agree (troupe's first sequence against PyTorch's)"]
text = "\n".join(lines)
print(text)
if out:
    open(out, "w").write(text + "\n")
PY
