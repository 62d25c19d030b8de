#!/usr/bin/env bash
# Bad input ends with a message naming the flag / file / key and the fix, a non-zero exit, and nothing
# written: no checkpoint directory, no metrics file, no partial dataset.
source "$(dirname "$0")/common.bash"
make_corpus

# expect_usage_error <text that must appear in stderr> <command...>
expect_error() {
  local want=$1
  shift
  rm -rf out m.jsonl
  set +e
  "$@" > stdout.txt 2> stderr.txt
  local rc=$?
  set -e
  [[ $rc -ne 0 ]] || fail "expected failure, got exit 0: $*"
  grep -qF -- "$want" stderr.txt || { cat stderr.txt >&2; fail "stderr does not mention '$want' for: $*"; }
  grep -q "error" stderr.txt || fail "no error line for: $*"
  [[ ! -e out && ! -e m.jsonl ]] || fail "files were written despite the error: $*"
  echo "ok ($rc): $want"
}

t() { small_train --train-iters 5 --save out --metrics-file m.jsonl "$@"; }

# Exit code 2 exactly (bad input), never a signal or 1.
expect_exit2() {
  local want=$1
  shift
  expect_error "$want" "$@"
  set +e
  "$@" > /dev/null 2>&1
  local rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "exit $rc, want 2 (bad input), for: $*"
}

# Sizes that cannot fit or overflow: refused before anything is allocated, naming the flag to lower
# (the memory check compares a lower bound of what the job holds with what the machine has).
expect_exit2 "--hidden-size or --num-layers" t --hidden-size 65536 --num-attention-heads 4
expect_exit2 "--hidden-size or --num-layers" t --num-layers 1000000
expect_exit2 "--micro-batch-size" t --micro-batch-size 1000000000 --global-batch-size 1000000000
expect_exit2 "--hidden-size must be 1 to" t --hidden-size 2147483644 --num-attention-heads 4
expect_exit2 "--seq-length" t --seq-length 100000000
# The check can be turned off (here it would pass anyway: a small model).
TROUPE_MEMORY_CHECK=off small_train --train-iters 1 --lr-warmup-iters 0 > /dev/null || fail "TROUPE_MEMORY_CHECK=off broke a small run"

expect_error "--num-attention-heads" t --hidden-size 50
expect_error "--global-batch-size" t --global-batch-size 7
expect_error "--micro-batch-size" t --micro-batch-size 0
expect_error "--seq-length" t --seq-length 64 --max-position-embeddings 32
expect_error "--lr-decay-style" t --lr-decay-style sometimes
expect_error "--foo" t --foo 3
expect_error "nope" t --data-path nope
expect_error "--tokenizer-type" t --tokenizer-type WordPiece

# A truncated index file.
cp d_text_document.bin broken_text_document.bin
head -c 100 d_text_document.idx > broken_text_document.idx
expect_error "broken_text_document.idx" t --data-path broken_text_document
# A .bin file that is shorter than the index says.
cp d_text_document.idx short_text_document.idx
head -c 1000 d_text_document.bin > short_text_document.bin
expect_error "short_text_document.bin" t --data-path short_text_document

# DeepSpeed config: unknown key, malformed JSON, missing file.
echo '{"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 1, "foo": 1}}' > ds_bad_key.json
expect_error "zero_optimization.foo" t --deepspeed-config ds_bad_key.json
echo '{"train_batch_size": 6,' > ds_broken.json
expect_error "ds_broken.json" t --deepspeed-config ds_broken.json
expect_error "missing.json" t --deepspeed-config missing.json

# Resuming from something that is not a checkpoint: an iter_* folder without the tracker file (an
# unfinished save) is an error; an empty or missing folder starts from scratch, as Megatron's --load,
# saying so, unless --exit-on-missing-checkpoint.
mkdir -p notackpt/iter_0000003
expect_error "notackpt" t --load notackpt
mkdir -p emptyckpt
t --load emptyckpt > fresh.txt 2>&1 || { cat fresh.txt; fail "--load of an empty folder did not start from scratch"; }
grep -q "note: --load emptyckpt: no checkpoint there yet, so training starts from scratch" fresh.txt ||
  { cat fresh.txt; fail "--load of an empty folder: no note"; }
expect_error "nosuchckpt" t --load nosuchckpt --exit-on-missing-checkpoint

# eval / preprocess / ckpt with bad input.
expect_error "--load" "$troupe" eval --load nowhere --data-path d_text_document
small_train --train-iters 1 --lr-warmup-iters 0 --save good > /dev/null
expect_error "--eval-samples" "$troupe" eval --load good --data-path d_text_document --eval-samples 100000000
expect_error "missing.txt" "$troupe" preprocess --input missing.txt --output-prefix out --tokenizer-type ByteLevelTokenizer
[[ ! -e out_text_document.bin ]] || fail "preprocess left output behind"
printf '{"text": "fine"}\n{"text": broken\n' > bad.jsonl
expect_error "line 2" "$troupe" preprocess --input bad.jsonl --output-prefix out --tokenizer-type ByteLevelTokenizer
[[ ! -e out_text_document.bin && ! -e out_text_document.idx ]] || fail "preprocess left output behind"
expect_error "hf" "$troupe" ckpt export --load good --format onnx --output x.h5

# A metadata.json whose config claims a far larger model than its shards hold: refused before that
# model is built (it once made eval allocate 22 GB), by eval and by ckpt convert.
for claim in "hidden_size=4096 num_layers=24 num_attention_heads=32" "hidden_size=96"; do
  rm -rf crafted && cp -r good crafted
  python3 - crafted/iter_0000001/metadata.json $claim <<'PY'
import json, sys
path, claims = sys.argv[1], sys.argv[2:]
m = json.load(open(path))
c = json.loads(m["config"])
for kv in claims:
    k, v = kv.split("=")
    c["model"][k] = int(v)
m["config"] = json.dumps(c)
json.dump(m, open(path, "w"))
PY
  expect_exit2 "the metadata does not belong to these shards" "$troupe" eval --load crafted --data-path d_text_document
  expect_exit2 "the metadata does not belong to these shards" "$troupe" ckpt convert --load crafted --save crafted_tp2 \
    --target-tensor-parallel-size 2
done

# A dataset tokenised with another vocabulary (GPT-2 BPE ids > 256) trained as byte-level.
bpe=$src_dir/.deps/gpt2
if [[ -s $bpe/encoder.json ]]; then
  "$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix bpe \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$bpe/encoder.json" --merge-file "$bpe/vocab.bpe" --append-eod > /dev/null
  expect_error "vocabulary" t --data-path bpe_text_document
fi
echo PASS
