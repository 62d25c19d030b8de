#!/usr/bin/env bash
# Real users' scripts (issue 13): shrunk copies of Megatron-LM's own example scripts, under
# tests/cli/scripts/, run with only sizes, paths and the launcher changed. Megatron-LM's
# examples/pretrain_gpt.sh: as written (with --fp16) the one problem reported is --fp16; without it
# it trains from its empty --load folder (a note says so), the learning rate of every iteration is
# Megatron's for --lr-warmup-fraction over --lr-decay-iters (computed here from the formula), and
# run again with the same --save/--load it resumes.
source "$(dirname "$0")/common.bash"
scripts=$src_dir/tests/cli/scripts
vocab=$src_dir/fuzz/data/gpt2_tiny/encoder.json merges=$src_dir/fuzz/data/gpt2_tiny/vocab.bpe
head -c 40000 /usr/share/games/fortunes/fortunes 2>/dev/null > corpus.txt || seq 1 3000 > corpus.txt
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix web \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges" --append-eod > /dev/null
run() { TROUPE=$troupe DATA_PATH=web_text_document CHECKPOINT_PATH=ck VOCAB=$vocab MERGES=$merges bash "$scripts/$1" "${@:2}"; }

set +e
FP16=--fp16 run pretrain_gpt.sh > fp16.out 2> fp16.err
rc=$?
set -e
(( rc == 2 )) || { cat fp16.out fp16.err; fail "pretrain_gpt.sh with --fp16: rc $rc, not 2"; }
grep -q "error: --fp16: troupe trains in float32" fp16.err && ! grep -q "problems" fp16.err ||
  { cat fp16.err; fail "pretrain_gpt.sh with --fp16: --fp16 should be the one problem"; }
[[ ! -e ck ]] || fail "a refused run created its --save folder"
echo "ok: pretrain_gpt.sh as written: the one refusal is --fp16"

run pretrain_gpt.sh --metrics-file m.jsonl > run1.log 2>&1 || { cat run1.log; fail "pretrain_gpt.sh without --fp16 failed"; }
for note in "--load ck: no checkpoint there yet" "--checkpoint-activations: read as --recompute-granularity full" \
            "--data-impl mmap: no effect" "--distributed-backend nccl: no effect"; do
  grep -qF -- "note: $note" run1.log || { cat run1.log; fail "no start-up note '$note'"; }
done
python3 - m.jsonl <<'PY' || fail "the learning rate is not Megatron's"
import json, math, sys
lr, min_lr, G, decay_iters, frac = 0.00015, 1.0e-5, 4, 24, .13
D = decay_iters * G; W = frac * D                      # Megatron: samples
rows = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"]
assert len(rows) == 30, len(rows)
for j in rows:
    n = (j["iteration"] - 1) * G                        # samples consumed before the step
    if n <= W: want = lr * n / W
    elif n > D: want = min_lr
    else: want = min_lr + 0.5 * (math.cos(math.pi * (n - W) / (D - W)) + 1.0) * (lr - min_lr)
    assert abs(j["lr"] - want) <= 1e-15 + 1e-12 * want, (j["iteration"], j["lr"], want)
print("ok: 30 iterations, warm-up over", W, "samples, cosine to", D)
PY
[[ -f ck/latest_checkpointed_iteration.txt ]] || fail "no checkpoint in ck"
run pretrain_gpt.sh --train-iters 32 --metrics-file m2.jsonl > run2.log 2>&1 || { cat run2.log; fail "the second run did not resume"; }
grep -q "note: --load ck" run2.log && fail "the second run started from scratch"
python3 -c "import json,sys; it=[j['iteration'] for j in map(json.loads, open('m2.jsonl')) if j.get('type')=='train']; sys.exit(0 if it==[31,32] else 1)" ||
  fail "the second run did not continue at iteration 31"
echo "PASS: Megatron-LM's pretrain_gpt.sh runs with only sizes, paths, the launcher and --fp16 changed"
