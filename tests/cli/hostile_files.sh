#!/usr/bin/env bash
# Hostile files against the CLI (issue 10): out-of-range numbers in a DeepSpeed JSON, int64 token ids
# beyond int32, non-regular vocabulary files, and symlinks planted where troupe creates temporaries
# and swap files. Each ends with a message and exit 2 (or succeeds) -- never a signal, a hang, or a
# write through the symlink.
source "$(dirname "$0")/common.bash"
make_corpus

# expect_exit <code> <text in stderr> <command...>
expect_exit() {
  local want_rc=$1 want=$2
  shift 2
  set +e
  "$@" > stdout.txt 2> stderr.txt
  local rc=$?
  set -e
  [[ $rc -eq $want_rc ]] || { cat stderr.txt >&2; fail "exit $rc (wanted $want_rc): $*"; }
  grep -qF -- "$want" stderr.txt || { cat stderr.txt >&2; fail "stderr lacks '$want': $*"; }
  echo "ok ($rc): $want"
}

t() { small_train --train-iters 4 --lr-warmup-iters 1 "$@"; }

# 1e400 in a DeepSpeed JSON used to end in std::terminate (exit 134).
printf '{"train_batch_size": 6, "gradient_clipping": 1e400}\n' > e400.json
expect_exit 2 'key "gradient_clipping" holds the number 1e400' t --deepspeed-config e400.json
printf '{"train_micro_batch_size_per_gpu": 10000000000000000000}\n' > e19.json
expect_exit 2 '"train_micro_batch_size_per_gpu" must be an integer in [1, 2147483647]' \
  t --deepspeed-config e19.json

# An int64 dataset holding 2^32 + 7 used to train as token 7.
python3 - <<'PY'
import struct
tokens = [(i * 7) % 250 for i in range(400)]
tokens[123] = 2**32 + 7
sizes = [100] * 4
with open("wide_text_document.bin", "wb") as f:
    f.write(struct.pack("<%dq" % len(tokens), *tokens))
with open("wide_text_document.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 5, len(sizes), len(sizes) + 1))
    f.write(struct.pack("<%di" % len(sizes), *sizes))
    f.write(struct.pack("<%dq" % len(sizes), *[800 * i for i in range(len(sizes))]))
    f.write(struct.pack("<%dq" % (len(sizes) + 1), *range(len(sizes) + 1)))
PY
expect_exit 2 "holds token id 4294967303" t --data-path wide_text_document

# A vocabulary file that never ends (/dev/zero) is refused before anything is read.
expect_exit 2 "--vocab-file /dev/zero" t --tokenizer-type GPT2BPETokenizer --vocab-file /dev/zero \
  --merge-file /dev/zero

# A JSONL line with a number no double holds: exit 2 (bad input), the key named, nothing written.
printf '{"text": "a"}\n{"text": "b", "score": 1e400}\n' > e400.jsonl
expect_exit 2 'line 2: key "score" holds the number 1e400' "$troupe" preprocess \
  --input e400.jsonl --output-prefix e400 --tokenizer-type ByteLevelTokenizer
[[ ! -e e400_text_document.bin ]] || fail "preprocess wrote output despite the error"

# Preprocess: symlinks at the old predictable temporary names and at the outputs are never written
# through; the outputs replace the symlinks.
echo "precious" > victim
bash -c 'for n in p_text_document.bin p_text_document.idx p_text_document.bin.tmp.$$ \
           p_text_document.idx.tmp.$$; do ln -s victim "$n"; done
         exec "$0" preprocess --input corpus.txt --input-format text --text-separator % \
           --output-prefix p --tokenizer-type ByteLevelTokenizer --append-eod' "$troupe" > /dev/null
[[ "$(cat victim)" == precious ]] || fail "preprocess wrote through a planted symlink"
[[ -f p_text_document.bin && ! -L p_text_document.bin ]] || fail "p_text_document.bin is not a file"
cmp -s p_text_document.bin d_text_document.bin || fail "the dataset differs from the same input's"
echo "ok: preprocess ignores planted symlinks"

# Optimizer swap files: a symlink at troupe-optimizer-rank0-pid<PID>.swap (the pid is known to
# whoever starts the process: exec keeps it) is not followed.
mkdir swap
bash -c 'ln -s "$PWD/victim" swap/troupe-optimizer-rank0-pid$$.swap; exec "$@"' _ \
  "$troupe" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
  --micro-batch-size 3 --global-batch-size 6 --lr 3e-3 --data-path d_text_document \
  --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000 --train-iters 2 \
  --zero-stage 1 --offload-optimizer nvme --offload-path swap > swap.log 2>&1 ||
  { cat swap.log >&2; fail "training with --offload-optimizer nvme failed"; }
[[ "$(cat victim)" == precious ]] || fail "the swap file was written through a planted symlink"
[[ $(ls swap | wc -l) -eq 1 ]] || fail "files left in the swap directory: $(ls swap)"
echo "ok: the swap file ignores a planted symlink"
echo PASS
