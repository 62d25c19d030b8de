#!/usr/bin/env bash
# Megatron's data blends and per-split data paths end to end (docs/DATA.md, "Blends"):
#   - a blend trains, is deterministic, the quoted and the split forms are the same blend, and it
#     differs from training on one of its datasets;
#   - resuming a blended run is exact (8 iterations straight == 4, save, --load, 4 more);
#   - --train-data-path reads the whole dataset as --data-path with --split 1,0,0 does (same losses),
#     and --valid-data-path is what the validation loss is computed on;
#   - malformed blends are refused with exit 2, every problem named, nothing written;
#   - preprocess keeps empty documents, splits sentences, accepts --partitions and --log-interval.
source "$(dirname "$0")/common.bash"
make_corpus  # d_text_document
# Two more corpora of other text: e (training), v (validation only).
for i in $(seq 1 400); do
  printf '{"text": "Record %d: %d apples and %d pears were counted on day %d of the harvest."}\n' \
    "$i" "$((i * 13 % 97))" "$((i * 7 % 31))" "$((i % 30))"
done > e.jsonl
for i in $(seq 1 200); do
  printf '{"text": "ZZZZ %d ####### %d qqqqq!!!! %d"}\n' "$i" "$((i * 3))" "$((i * 11))"
done > v.jsonl
"$troupe" preprocess --input e.jsonl --output-prefix e --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null
"$troupe" preprocess --input v.jsonl --output-prefix v --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null

# small_train's flags without its --data-path (for the per-split paths).
train() {
  "$troupe" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
    --micro-batch-size 3 --global-batch-size 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
    --lr-warmup-iters 3 --weight-decay 0.1 --tokenizer-type ByteLevelTokenizer \
    --eval-interval 1000 --log-interval 1000 "$@"
}
# small_train passes --data-path d_text_document; a later --data-path replaces it (Megatron's argparse).
blend=(--data-path 0.3 d_text_document 0.7 e_text_document)
small_train --train-iters 8 "${blend[@]}" --save straight --metrics-file straight.jsonl > straight.log
grep -q "blend of 2 datasets" straight.log || fail "the run does not describe its blend: $(grep data: straight.log)"
small_train --train-iters 8 --data-path "0.3 d_text_document 0.7 e_text_document" --metrics-file quoted.jsonl > /dev/null
small_train --train-iters 8 --metrics-file single.jsonl > /dev/null
losses straight.jsonl > a.txt
losses quoted.jsonl > q.txt
losses single.jsonl > s.txt
[[ $(wc -l < a.txt) == 8 ]] || fail "expected 8 iterations"
diff a.txt q.txt || fail "the quoted blend trains differently from the same blend as separate arguments"
if diff -q a.txt s.txt > /dev/null; then fail "the blend trains exactly as d alone: blending had no effect"; fi

# Resume: stop at 4 (--exit-interval saves), load, continue to 8.
small_train --train-iters 8 --exit-interval 4 "${blend[@]}" --save resumed --metrics-file resumed.jsonl > /dev/null
[[ $(cat resumed/latest_checkpointed_iteration.txt) == 4 ]] || fail "no checkpoint at iteration 4"
small_train --train-iters 8 "${blend[@]}" --load resumed --save resumed --metrics-file resumed.jsonl > second.log
grep -q "loaded .*iteration 4" second.log || fail "the second run did not load iteration 4"
losses resumed.jsonl > b.txt
diff a.txt b.txt || fail "the resumed blended run differs from the straight one"

# Per-split paths: training on the whole of d as --split 1,0,0 does; validation on v, or on d.
small_train --train-iters 4 --data-path d_text_document --split 1,0,0 --metrics-file whole.jsonl > /dev/null
train --train-iters 4 --train-data-path d_text_document --valid-data-path v_text_document \
  --eval-interval 2 --eval-iters 2 --metrics-file pv.jsonl > pv.log
train --train-iters 4 --train-data-path d_text_document --valid-data-path d_text_document \
  --eval-interval 2 --eval-iters 2 --metrics-file pd.jsonl > /dev/null
losses whole.jsonl > w.txt
losses pv.jsonl > pv.txt
losses pd.jsonl > pd.txt
diff w.txt pv.txt || fail "--train-data-path d trains differently from --data-path d --split 1,0,0"
diff pv.txt pd.txt || fail "the validation set changed the training"
evals() { grep '"type":"eval"' "$1" | python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["validation_loss"]) for l in sys.stdin))'; }
ev=$(evals pv.jsonl)
ed=$(evals pd.jsonl)
[[ -n "$ev" && $(wc -w <<< "$ev") == 2 ]] || fail "expected 2 evaluations, got '$ev'"
[[ "$ev" != "$ed" ]] || fail "validation on v and on d gave the same losses: $ev"
echo "validation loss on v: $ev; on d: $ed"

# Malformed blends: exit 2, every problem, nothing written.
expect_refused() {
  local what=$1
  set +e
  local how=$2
  shift 2
  $how --train-iters 4 --save refused "$@" > out.txt 2> err.txt
  local rc=$?
  set -e
  [[ $rc == 2 ]] || fail "$* exited $rc (expected 2): $(cat err.txt)"
  for w in $what; do grep -qF -- "$w" err.txt || fail "$*: the message lacks '$w': $(cat err.txt)"; done
  [[ ! -e refused ]] || fail "$*: --save was written"
}
expect_refused "odd 0.7" small_train --data-path 0.3 d_text_document 0.7
expect_refused "weights all 0" small_train --data-path 0 d_text_document 0 e_text_document
expect_refused "nope1 nope2 not found" small_train --data-path 0.5 nope1 0.5 nope2
expect_refused "'x' not a number" small_train --data-path "0.5 d_text_document x e_text_document"
expect_refused "single data source" small_train --train-data-path d_text_document
expect_refused "--train-data-path" train --valid-data-path v_text_document
expect_refused "not finite" small_train --data-path "inf d_text_document 1 e_text_document"

# preprocess: an empty document is kept (doc_idx repeats), sentences, partitions, progress lines.
printf '{"text": "One. Two!"}\n{"text": ""}\n{"text": "Three? Four."}\n' > s.jsonl
"$troupe" preprocess --input s.jsonl --output-prefix s --tokenizer-type ByteLevelTokenizer --append-eod \
  --split-sentences --partitions 2 --log-interval 1 > s.log 2> s.err
[[ -f s_text_sentence.idx ]] || fail "--split-sentences did not write s_text_sentence.idx"
[[ $(grep -c documents s.err) -ge 3 ]] || fail "--log-interval 1 printed no progress lines: $(cat s.err)"
/usr/bin/python3 - <<'PY' || fail "the sentence dataset is not as expected"
import struct
b = open("s_text_sentence.idx", "rb").read()
n, d = struct.unpack("<QQ", b[18:34])
sizes = struct.unpack("<%di" % n, b[34:34 + 4 * n])
doc_idx = struct.unpack("<%dq" % d, b[34 + 12 * n:34 + 12 * n + 8 * d])
assert sizes == (4, 4 + 1, 6, 5 + 1), sizes
assert doc_idx == (0, 2, 2, 4), doc_idx
PY
echo PASS
