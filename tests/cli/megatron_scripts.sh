#!/usr/bin/env bash
# Real users' scripts (issue 13): shrunk copies of Megatron-LM's and Megatron-DeepSpeed's own example scripts, under
# tests/cli/scripts/, run with only sizes, paths and the launcher changed. Megatron-LM's
# examples/pretrain_gpt.sh as written (with --fp16) trains from its empty --load folder (a note says
# so) under Megatron's dynamic loss scaling, the learning rate of every iteration is Megatron's for
# --lr-warmup-fraction over --lr-decay-iters (computed here from the formula, skipped iterations not
# advancing it), and run again with the same --save/--load it resumes.
source "$(dirname "$0")/common.bash"
scripts=$src_dir/tests/cli/scripts
vocab=$src_dir/fuzz/data/gpt2_tiny/encoder.json merges=$src_dir/fuzz/data/gpt2_tiny/vocab.bpe
head -c 40000 /usr/share/games/fortunes/fortunes 2>/dev/null > corpus.txt || seq 1 3000 > corpus.txt
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix web \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges" --append-eod > /dev/null
run() { TROUPE=$troupe DATA_PATH=web_text_document CHECKPOINT_PATH=ck VOCAB=$vocab MERGES=$merges bash "$scripts/$1" "${@:2}"; }

run pretrain_gpt.sh --metrics-file m.jsonl > run1.log 2>&1 || { cat run1.log; fail "pretrain_gpt.sh (with --fp16) failed"; }
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
assert rows[0]["loss_scale"] == 2.0 ** 32, rows[0]["loss_scale"]  # Megatron's --initial-loss-scale default
n = 0                                                   # samples of the applied steps before this one:
for j in rows:                                          # a skipped (overflowed) step does not advance it
    if n <= W: want = lr * n / W
    elif n > D: want = min_lr
    else: want = min_lr + 0.5 * (math.cos(math.pi * (n - W) / (D - W)) + 1.0) * (lr - min_lr)
    assert abs(j["lr"] - want) <= 1e-15 + 1e-12 * want, (j["iteration"], j["lr"], want)
    n += 0 if j["skipped"] else G
skipped = sum(j["skipped"] for j in rows)
assert 0 < skipped < 30, skipped
print(f"ok: 30 iterations in fp16 ({skipped} skipped by the loss scaler), warm-up over", W, "samples, cosine to", D)
PY
[[ -f ck/latest_checkpointed_iteration.txt ]] || fail "no checkpoint in ck"
run pretrain_gpt.sh --train-iters 32 --metrics-file m2.jsonl > run2.log 2>&1 || { cat run2.log; fail "the second run did not resume"; }
grep -q "note: --load ck" run2.log && fail "the second run started from scratch"
python3 - m.jsonl m2.jsonl <<'PY' || fail "the second run did not continue at iteration 31 with the loss scale saved"
import json, sys
first, second = ([j for j in map(json.loads, open(p)) if j.get("type") == "train"] for p in sys.argv[1:3])
assert [j["iteration"] for j in second] == [31, 32], [j["iteration"] for j in second]
# The loss scaler's state came along: the resumed run starts from the scale the first run ended on
# (or its update after iteration 30), not from 2^32 again.
last = first[-1]["loss_scale"]
assert second[0]["loss_scale"] in (last, last * 2, last / 2), (last, second[0]["loss_scale"])
PY
echo "ok: Megatron-LM's pretrain_gpt.sh runs with only sizes, paths and the launcher changed, --fp16 included"

# Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh under troupe launch (4 ranks: tp 2 x pp 2):
# the batch-size ramp-up in an iteration-based run (which Megatron itself refuses), TensorBoard.
# --initial-loss-scale 4096 (the test's, beside the script's --fp16): from Megatron's 2^32 every one of
# the 16 iterations overflows and the learning rate never leaves 0.
port=$(free_port)
MASTER_PORT=$port TROUPE=$troupe bash "$scripts/train_gpt3_175b_distributed.sh" ck175 tb175 "$vocab" "$merges" \
  web_text_document --metrics-file g175.jsonl --initial-loss-scale 4096 > g175.log 2>&1 ||
  { tail -30 g175.log; fail "train_gpt3_175b_distributed.sh failed"; }
for note in "--rampup-batch-size with --train-iters" "--attention-backend auto: no effect" "--load ck175: no checkpoint there yet"; do
  grep -qF -- "$note" g175.log || { cat g175.log; fail "train_gpt3_175b_distributed.sh: no start-up note '$note'"; }
done
python3 - g175.jsonl <<'PY' || fail "the 175B script's ramp-up or learning rate is not Megatron's"
import json, math, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"]
assert len(rows) == 16, len(rows)
start, inc, ramp, G = 2, 2, 40, 12
per = ramp / ((G - start) // inc)
batch = lambda n: G if n > ramp else start + int(n / per) * inc
lr, min_lr, D = 6.0e-5, 6.0e-6, 14 * G                # Megatron's iteration-based lengths, in samples
W = .001 * D
n = s = 0    # samples consumed (the ramp-up's clock) and those of the applied steps (the rate's)
for j in rows:
    b = batch(n)
    if s <= W: want = lr * s / W
    elif s > D: want = min_lr
    else: want = min_lr + 0.5 * (math.cos(math.pi * (s - W) / (D - W)) + 1.0) * (lr - min_lr)
    assert j["global_batch_size"] == b and abs(j["lr"] - want) <= 1e-15 + 1e-12 * want, (j, b, want)
    n += b
    s += 0 if j["skipped"] else b
print("ok: the 175B script's 16 iterations (fp16,", sum(j["skipped"] for j in rows), "skipped) ramp",
      sorted({j["global_batch_size"] for j in rows}), "with Megatron's rates")
PY
ls tb175/events.out.tfevents.* > /dev/null 2>&1 || fail "the 175B script wrote no TensorBoard events into tb175"
echo "ok: Megatron-LM's train_gpt3_175b_distributed.sh runs under troupe launch with only sizes, paths and the launcher changed"

# Megatron-DeepSpeed's examples_deepspeed/rebase/ds_pretrain_gpt_125M_flashattn.sh with its DeepSpeed
# JSON template: token-based run and schedule, ZeRO-1 from the JSON, TensorBoard.
mkdir -p mds && cd mds
TROUPE=$troupe SCRIPT_DIR=$scripts VOCAB_PATH=$vocab MERGE_PATH=$merges DATA_BLEND=../web_text_document \
  bash "$scripts/ds_pretrain_gpt_125M_flashattn.sh" --metrics-file m125.jsonl > run.log 2>&1 ||
  { tail -30 run.log; fail "ds_pretrain_gpt_125M_flashattn.sh (fp16, its JSON's fp16 block) failed"; }
for note in '"prescale_gradients" in' "--use-flash-attn: no effect" \
            "--deepspeed-activation-checkpointing: no effect" "--checkpoint-activations: read as"; do
  grep -qF -- "$note" run.log || { cat run.log; fail "the 125M script: no start-up note '$note'"; }
done
python3 - m125.jsonl <<'PY' || fail "the 125M script's token schedule or loss scale is not Megatron-DeepSpeed's"
import json, math, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "train"]
assert len(rows) == 10, len(rows)                     # --train-tokens 2560 of 8 x 32 tokens an iteration
lr, min_lr, Wt, Dt, tok = 6.0e-4, 1.0e-6, 512, 2560, 8 * 32
# The JSON's fp16 block governs the scaler, as DeepSpeed's engine does: 2^initial_scale_power.
assert rows[0]["loss_scale"] == 2.0 ** 11, rows[0]["loss_scale"]
t = 0                                                 # tokens of the applied steps (DeepSpeed does not
for j in rows:                                        # step the schedule on an overflow)
    if t <= Wt: want = lr * t / Wt
    elif t > Dt: want = min_lr
    else: want = min_lr + 0.5 * (math.cos(math.pi * (t - Wt) / (Dt - Wt)) + 1.0) * (lr - min_lr)
    assert abs(j["lr"] - want) <= 1e-15 + 1e-12 * want, (j["iteration"], j["lr"], want)
    t += 0 if j["skipped"] else tok
print("ok: the 125M script's 10 fp16 iterations follow Megatron-DeepSpeed's token schedule,",
      sum(j["skipped"] for j in rows), "skipped")
PY
ls output/tensorboard/*/events.out.tfevents.* > /dev/null 2>&1 || fail "the 125M script wrote no TensorBoard events"
cd ..

# Megatron-DeepSpeed's examples_deepspeed/pretrain_llama2_distributed.sh: LLaMA's architecture
# flags (rotary, SwiGLU, RMSNorm, GQA, untied head, no biases, --ffn-hidden-size) parse as troupe's
# model-family flags and its --bf16 (with the file's "bf16" block) as troupe's bf16. With an empty
# tokenizer model the tokenizer's problems are the only ones, in one message, exit 2, nothing written.
mkdir -p llama && : > llama/tokenizer.model
set +e
MASTER_PORT=$(free_port) TROUPE=$troupe BASE_PATH=$PWD/llama/tmp DATASET_1=web_text_document \
  TOKENIZER_PATH=$PWD/llama/tokenizer.model bash "$scripts/pretrain_llama2_distributed.sh" > llama.log 2>&1
rc=$?
set -e
(( rc == 2 )) || { cat llama.log; fail "pretrain_llama2_distributed.sh with an empty tokenizer model: rc $rc, not 2"; }
python3 - llama.log <<'PY' || { cat llama.log; fail "pretrain_llama2_distributed.sh: not exactly the tokenizer's problems"; }
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"error: (\d+) problems with the flags:", text)
items = re.findall(r"^  - (.*)$", text, re.M)[:int(m.group(1))] if m else [re.search(r"error: (.*)", text).group(1)]
assert items and all(i.startswith(("--tokenizer-model", "--tokenizer-type")) for i in items), items
for flag in ["--bf16", "--ffn-hidden-size", "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights",
             "--swiglu", "--normalization", "--disable-bias-linear", "--num-key-value-heads"]:
    assert not any(i.startswith(flag) for i in items), (flag, items)
print(f"ok: pretrain_llama2_distributed.sh: {len(items)} problems, the empty tokenizer model's; bf16 and the architecture accepted")
PY
[[ ! -e llama/tmp/iter_0000001 ]] || fail "the refused LLaMA run wrote a checkpoint"
# The script itself as written, --bf16 included: with a real SentencePiece model (trained here by
# python3-sentencepiece on the corpus) and its data preprocessed with that model's
# GPTSentencePieceTokenizer, it trains in bf16 under `troupe launch` on its 4 processes, tp 2 x pp 2:
# 10 iterations of finite losses and the checkpoint it saves at the end.
if /usr/bin/python3 -c "import sentencepiece" 2> /dev/null; then
  /usr/bin/python3 - corpus.txt llama/sp.model <<'PY'
import io, sys
import sentencepiece as spm
lines = [l for l in open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines() if l.strip()]
model = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="bpe",
                               vocab_size=600, hard_vocab_limit=False, num_threads=1, minloglevel=2)
open(sys.argv[2], "wb").write(model.getvalue())
PY
  "$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix llama/sp \
    --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model llama/sp.model --append-eod > /dev/null
  MASTER_PORT=$(free_port) TROUPE=$troupe BASE_PATH=$PWD/llama/run DATASET_1=$PWD/llama/sp_text_document \
    TOKENIZER_PATH=$PWD/llama/sp.model bash "$scripts/pretrain_llama2_distributed.sh" > llama_run.log 2>&1 \
    || { tail -40 llama_run.log; fail "pretrain_llama2_distributed.sh (bf16) did not train"; }
  /usr/bin/python3 - llama_run.log <<'PY' || { tail -40 llama_run.log; fail "pretrain_llama2_distributed.sh: not 10 finite losses"; }
import math, re, sys
text = open(sys.argv[1]).read()
losses = [float(x) for x in re.findall(r"lm loss: ([0-9.eE+-]+)", text)]
assert len(losses) >= 10 and all(math.isfinite(x) for x in losses), losses
assert "memory plan per rank (bf16 weights and activations" in text, "the log does not say the run is bf16"
print(f"ok: pretrain_llama2_distributed.sh trains in bf16 on tp 2 x pp 2: losses {losses[0]:.3f} -> {losses[-1]:.3f}")
PY
  ls -d llama/run/iter_0000010 > /dev/null 2>&1 || { ls -R llama/run | head; fail "the LLaMA run saved no checkpoint at iteration 10"; }
fi
# The script's architecture on troupe's own data and tokenizer: --dry-run prints the LLaMA plan for
# its tp 2 x pp 2 layout, and training it there gives the 1x1x1 run's losses.
arch=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 64
      --ffn-hidden-size 176 --num-attention-heads 8 --micro-batch-size 2 --global-batch-size 4 --seq-length 32
      --max-position-embeddings 32 --train-iters 10 --mock-data --tokenizer-type ByteLevelTokenizer
      --attention-dropout 0 --hidden-dropout 0 --use-rotary-position-embeddings --untie-embeddings-and-output-weights
      --swiglu --normalization rmsnorm --disable-bias-linear --num-key-value-heads 2)
"$troupe" train "${arch[@]}" --dry-run > dry.log 2>&1 || { cat dry.log; fail "--dry-run of the LLaMA architecture failed"; }
for want in "LLaMA 4 layers, hidden 64, 8 heads (2 key/value groups, head dimension 8), MLP 176 (swiglu), rope positions, RMSNorm" \
            "memory plan per rank (fp32; tp 2, pp 2, dp 1, ZeRO stage 0, recompute none):" "  stage 1:"; do
  grep -qF -- "$want" dry.log || { cat dry.log; fail "--dry-run: no line '$want'"; }
done
# 4 layers of RMSNorm 64 x 2, qkv (8 + 2 x 2) x 8 x 64, projection 64 x 64, fc1 2 x 176 x 64, fc2 176 x 64;
# wte and lm_head 257 x 64, ln_f.
want_params=$(( 4 * (2 * 64 + 64 * 96 + 64 * 64 + 64 * 352 + 176 * 64) + 2 * 257 * 64 + 64 ))
grep -qF "$want_params parameters" dry.log || { cat dry.log; fail "--dry-run: not $want_params parameters"; }
# It trains on the script's tp 2 x pp 2, every iteration's loss within 1e-5 of the 1x1x1 run's.
"$troupe" train "${arch[@]}" --metrics-file llama_tp2pp2.jsonl > llama_tp2pp2.log 2>&1 \
  || { cat llama_tp2pp2.log; fail "the LLaMA architecture on tp 2 x pp 2 failed"; }
single=()
for a in "${arch[@]}"; do single+=("$a"); done
single[1]=1; single[3]=1   # --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
"$troupe" train "${single[@]}" --metrics-file llama_1x1.jsonl > llama_1x1.log 2>&1 \
  || { cat llama_1x1.log; fail "the LLaMA architecture on 1x1x1 failed"; }
python3 - llama_1x1.jsonl llama_tp2pp2.jsonl <<'PY' || fail "the LLaMA architecture: tp 2 x pp 2 differs from 1x1x1"
import json, math, sys
def losses(path):
    return {j["iteration"]: j["lm_loss"] for j in map(json.loads, open(path)) if j.get("type") == "train"}
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
assert len(ref) == 10 and ref.keys() == got.keys(), (sorted(ref), sorted(got))
for it in ref:
    assert math.isfinite(ref[it]) and abs(got[it] - ref[it]) <= 1e-5 * abs(ref[it]), (it, got[it], ref[it])
assert ref[10] < ref[1], (ref[1], ref[10])
print(f"ok: the LLaMA architecture trains on tp 2 x pp 2, 10 losses within 1e-5 of 1x1x1 ({ref[1]:.4f} -> {ref[10]:.4f})")
PY
echo "PASS: Megatron-LM's pretrain_gpt.sh and train_gpt3_175b_distributed.sh (fp16) and Megatron-DeepSpeed's ds_pretrain_gpt_125M_flashattn.sh (fp16) and pretrain_llama2_distributed.sh (bf16, tp 2 x pp 2) run with only sizes, paths and the launcher changed"
