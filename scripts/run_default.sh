#!/usr/bin/env bash
# The main job on its built-in default: installs and builds what is missing, prepares the default
# corpus (Debian's fortunes: real English text, ~2.5 MB), trains a small GPT-2 for a few minutes with
# live progress, saves a checkpoint, evaluates it and draws the loss curve.
#
# Outputs under runs/default/ (or $TROUPE_RUN_DIR): checkpoints/, metrics.jsonl, loss.svg.
# Extra arguments are passed to `troupe train` and override the defaults (e.g. --train-iters 50).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
TROUPE_TARGET=troupe "$here/scripts/build.sh"
troupe="${TROUPE_BUILD_DIR:-$here/build}/bin/troupe"
run=${TROUPE_RUN_DIR:-$here/runs/default}
mkdir -p "$run"

# The corpus and the training flags (scripts/default_job.bash, shared with tests/cli/default_curve.sh).
source "$here/scripts/default_job.bash"

# 1. Corpus: every plain fortune file (a line "%" separates fortunes; .dat/.u8 are indexes/links).
data="$run/fortunes_text_document"
if [[ ! -s "$data.bin" || ! -s "$data.idx" ]]; then
  corpus="$run/fortunes.txt"
  shopt -s nullglob
  default_corpus "$corpus.tmp"
  if [[ ! -s "$corpus.tmp" ]]; then
    echo "run_default: /usr/share/games/fortunes is empty -- install Debian's 'fortunes' package (scripts/setup.sh does)" >&2
    exit 1
  fi
  mv "$corpus.tmp" "$corpus"
  "$troupe" preprocess --input "$corpus" --input-format text --text-separator % \
    --output-prefix "$run/fortunes" --tokenizer-type ByteLevelTokenizer --append-eod
fi

# 2. Train: 4 layers, hidden 256, byte-level vocabulary, 32 sequences of 256 bytes per iteration
#    (8 per micro-batch, 4 accumulation steps), peak learning rate 1e-3 after 50 warm-up iterations
#    (2e-3 after 20 made the loss spike above ln 257 around iteration 11: scripts/default_job.bash);
#    about 4 minutes on 2 cores.
rm -f "$run/metrics.jsonl"
# Parallel layouts (e.g. --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
# --data-parallel-size 2 --zero-stage 3) train the same model and save sharded checkpoints that any
# layout can load.
"$troupe" train "${default_train_flags[@]}" --data-path "$data" \
  --eval-interval 50 --eval-iters 2 --log-interval 10 \
  --save "$run/checkpoints" --save-interval 50 --metrics-file "$run/metrics.jsonl" "$@"

# 3. Evaluate the checkpoint, plot the loss curve, and show what the model writes (docs/SERVE.md).
"$troupe" eval --load "$run/checkpoints" --data-path "$data" --eval-samples 64
"$troupe" plot --metrics-file "$run/metrics.jsonl" --output "$run/loss.svg"
echo "run_default: a sample of what the model writes (troupe generate, top-p 0.9, seed 1):"
"$troupe" generate --load "$run/checkpoints" --prompt "The " --prompt "Q: " --tokens-to-generate 120 \
  --top-p 0.9 --temperature 0.8 --seed 1
echo "run_default: checkpoint in $run/checkpoints, metrics in $run/metrics.jsonl, loss curve in $run/loss.svg"
