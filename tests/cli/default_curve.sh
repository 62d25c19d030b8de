#!/usr/bin/env bash
# The default job's loss curve has no spike: scripts/run_default.sh's corpus (every Debian fortune)
# and training flags (scripts/default_job.bash, seed 1234) for the first 15 of its 250 iterations (the
# schedule of the full run: --exit-interval stops it early); every loss from iteration 3 on must be
# below ln 257 = 5.549 (the uniform guess over the byte vocabulary) and at most 0.3 above the one
# before. With the flags before 2026-12-04 (peak learning rate 2e-3 after 20 warm-up iterations) the
# update of iteration 10 overstepped a cliff of the loss: 3.76 -> 7.34 at iteration 11 (grad norm 23),
# 3.61 at 12, and a newcomer's first curve showed it. About 20-40 s on 2 cores.
source "$(dirname "$0")/common.bash"

[[ -d /usr/share/games/fortunes ]] || { echo "SKIP: no /usr/share/games/fortunes (Debian's fortunes package)"; exit 77; }
source "$src_dir/scripts/default_job.bash"
grep -q 'default_train_flags\[@\]' "$src_dir/scripts/run_default.sh" ||
  fail "scripts/run_default.sh does not train with scripts/default_job.bash's default_train_flags"
default_corpus corpus.txt
[[ -s corpus.txt ]] || { echo "SKIP: /usr/share/games/fortunes holds no fortune file"; exit 77; }
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix d \
  --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null

"$troupe" train "${default_train_flags[@]}" --data-path d_text_document --exit-interval 15 \
  --log-interval 1 --eval-interval 1000 --metrics-file m.jsonl > train.log 2>&1 ||
  { cat train.log >&2; fail "the default job's first 15 iterations did not run"; }
losses m.jsonl > curve.txt
awk '{ printf "%s:%.3f ", $1, $2 } END { print "" }' curve.txt
awk 'NR >= 3 && ($2 >= 5.549 || $2 > prev + 0.3) { printf "iteration %d: loss %.4f after %.4f (grad norm %.2f)\n", $1, $2, prev, $3; bad = 1 }
     { prev = $2 } END { exit bad }' curve.txt ||
  fail "the default job's loss spiked (above): lower --lr or lengthen --lr-warmup-iters in scripts/default_job.bash"
(( $(wc -l < curve.txt) == 15 )) || fail "expected 15 iterations in m.jsonl, got $(wc -l < curve.txt)"
echo "PASS: the default job's first 15 iterations: no loss spike ($(awk 'END { printf "%.3f", $2 }' curve.txt) at 15)"
