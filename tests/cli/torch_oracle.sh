#!/usr/bin/env bash
# End-to-end numerical oracle: train a tiny GPT-2 with troupe on real text, export it as a Hugging Face state dict,
# and check that troupe's eval loss matches an independent PyTorch implementation (bench/torch_gpt.py, float64).
# Exit 0 pass, 1 fail, 77 skip (no torch/h5py in /usr/bin/python3, or no troupe binary).
# Environment: TROUPE_BIN (the troupe binary), TROUPE_SOURCE_DIR (repository root).
set -uo pipefail

PY=/usr/bin/python3
src="${TROUPE_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
bin="${TROUPE_BIN:-$src/build/bin/troupe}"

if [[ ! -x "$PY" ]] || ! "$PY" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then
  echo "SKIP: $PY lacks torch, h5py or numpy"
  exit 77
fi
if [[ ! -x "$bin" ]]; then
  echo "SKIP: troupe binary '$bin' not found (set TROUPE_BIN)"
  exit 77
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# Runs a command, keeping its output in $work/<name>.log; on failure prints it and fails the test.
step() {
  local name="$1"; shift
  echo "+ $*"
  if ! "$@" >"$name.log" 2>&1; then
    echo "FAIL: step '$name' exited non-zero:"
    cat "$name.log"
    exit 1
  fi
}

fortunes=/usr/share/games/fortunes/fortunes
if [[ -r "$fortunes" ]]; then
  head -n 300 "$fortunes" >corpus.txt
else
  cat >corpus.txt <<'TEXT'
It was a bright cold day in April, and the clocks were striking thirteen. The wind swept the dust along the
street in little eddies, and the people walked with their heads bowed against it.
%
A journey of a thousand miles begins with a single step, but the first step is usually the hardest to take,
and the last one is the one that nobody remembers.
%
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft
zebras jump! Sphinx of black quartz, judge my vow.
%
In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded
as a bad move. Many were increasingly of the opinion that they had all made a big mistake in coming down from
the trees in the first place.
%
Computers are good at following instructions, but not at reading your mind. A program does what you tell it
to do, not what you want it to do, and the difference between the two is where the bugs live.
%
The sea was calm that evening, and the lighthouse keeper sat by the window with a cup of tea, counting the
ships that passed in the fading light and writing their names in a worn leather notebook.
%
Never put off until tomorrow what you can do the day after tomorrow just as well. Time flies like an arrow;
fruit flies like a banana. A closed mouth gathers no feet.
%
The library was quiet except for the ticking of the old clock above the door. Dust floated in the beams of
sunlight, and somewhere among the shelves a page turned softly, as if the books were reading themselves.
TEXT
fi

step preprocess "$bin" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix d \
  --tokenizer-type ByteLevelTokenizer --append-eod
for f in d_text_document.bin d_text_document.idx; do
  [[ -s "$f" ]] || { echo "FAIL: preprocess did not create $f"; cat preprocess.log; exit 1; }
done

step train "$bin" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
  --micro-batch-size 3 --global-batch-size 6 --lr 3e-3 --train-iters 4 --data-path d_text_document \
  --tokenizer-type ByteLevelTokenizer --save ckpt --log-interval 1 --eval-interval 1000 --num-threads 1

step export "$bin" ckpt export --load ckpt --format hf-h5 --output hf.h5
[[ -s hf.h5 ]] || { echo "FAIL: ckpt export did not create hf.h5"; cat export.log; exit 1; }

# troupe eval's stdout must stay separate from its log lines (stderr): the JSON object is parsed from it.
echo "+ $bin eval --load ckpt --data-path d_text_document --eval-samples 20 --json"
if ! "$bin" eval --load ckpt --data-path d_text_document --eval-samples 20 --json >troupe_eval.out 2>troupe_eval.err
then
  echo "FAIL: troupe eval exited non-zero:"; cat troupe_eval.out troupe_eval.err; exit 1
fi

# --num-attention-heads: the head count cannot be inferred from shapes (hidden 48 is not 64 * heads) should the
# export lack an n_head attribute; torch_gpt.py fails if the file's n_head disagrees.
step torch_eval "$PY" "$src/bench/torch_gpt.py" eval --hf-h5 hf.h5 --data-prefix d_text_document --seq-length 32 \
  --samples 20 --double --num-attention-heads 3 --threads 1

"$PY" - troupe_eval.out torch_eval.log <<'EOF'
import json, math, sys

def last_json(path, what):
    found = None
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "loss" in obj:
                found = obj
    if found is None:
        print(f"FAIL: no JSON object with a 'loss' in {what}'s output:")
        print(open(path, encoding="utf-8", errors="replace").read())
        sys.exit(1)
    return found

t = last_json(sys.argv[1], "troupe eval")
p = last_json(sys.argv[2], "torch_gpt.py eval")
lt, lp = float(t["loss"]), float(p["loss"])
tol = 1e-6 * lp  # fp32 forward vs a float64 reference: rounding only
print(f"troupe : loss {lt:.10f}  perplexity {t.get('perplexity')}  tokens {t.get('tokens')}")
print(f"pytorch: loss {lp:.10f}  perplexity {p.get('perplexity')}  tokens {p.get('tokens')}  (float64)")
print(f"|diff| = {abs(lt - lp):.3e}, tolerance {tol:.3e} (relative {abs(lt - lp) / lp:.3e})")
ok = True
if not (math.isfinite(lt) and math.isfinite(lp)):
    print("FAIL: non-finite loss")
    ok = False
elif abs(lt - lp) > tol:
    print("FAIL: losses differ beyond tolerance")
    ok = False
if "tokens" not in t or int(t["tokens"]) != int(p["tokens"]):
    print(f"FAIL: token counts differ: troupe {t.get('tokens')} vs pytorch {p['tokens']}")
    ok = False
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
