#!/usr/bin/env bash
# Mixed precision through `troupe train` (docs/PRECISION.md):
#  1. --bf16 for 200 iterations on the default corpus (every Debian fortune, as scripts/run_default.sh
#     prepares it): every iteration's loss within 1% of the fp32 run's, and the bf16 run differs from
#     it (it did compute in 16 bits).
#  2. --fp16 with Megatron's dynamic loss scaling from its default initial scale 2^32: the first
#     iterations overflow and are skipped, each logged with its scale; the scale the metrics show
#     follows Megatron's rule (halve after --hysteresis overflows, double after --loss-scale-window clean
#     iterations), recomputed here from the skipped flags; the skipped iterations are counted in the
#     log line; the loss falls.
#  3. DeepSpeed's fp16 block (initial_scale_power 8, loss_scale_window 10, hysteresis 1): the scale
#     starts at 256 and follows DeepSpeed's rule.
#  4. A bf16 run on tp 2 x dp 2 with ZeRO-2 saves fp32 master weights; an fp32 run on one rank resumes
#     from them, and a bf16 resume on pp 2 too.
source "$(dirname "$0")/common.bash"

shopt -s nullglob
: > corpus.txt
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat | *.u8) continue ;; esac
  [[ -f "$f" ]] && cat "$f" >> corpus.txt
done
[[ -s corpus.txt ]] || make_corpus
[[ -s corpus.txt ]] && "$troupe" preprocess --input corpus.txt --input-format text --text-separator % \
  --output-prefix d --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null

py=/usr/bin/python3

# 1. bf16 against fp32, 200 iterations.
# Batches of 24 x 64 tokens at lr 1e-3: at small_train's 6 x 32 tokens and lr 3e-3 single
# iterations jump by 2% between any two runs that round differently (the mean stays at 0.2%).
long=(--train-iters 200 --seed 7 --global-batch-size 24 --micro-batch-size 6 --seq-length 64 --lr 1e-3 --min-lr 1e-4)
small_train "${long[@]}" --metrics-file f32.jsonl > f32.log
small_train "${long[@]}" --bf16 --metrics-file bf16.jsonl > bf16.log
"$py" - f32.jsonl bf16.jsonl <<'PY' || fail "bf16's loss curve left fp32's by more than 1% (see above)"
import json, sys
def curve(path):
    return [json.loads(l)["lm_loss"] for l in open(path) if json.loads(l).get("type") == "train"]
a, b = curve(sys.argv[1]), curve(sys.argv[2])
assert len(a) == len(b) == 200, (len(a), len(b))
worst = max(abs(x - y) / x for x, y in zip(a, b))
mean = sum(abs(x - y) / x for x, y in zip(a, b)) / len(a)
print(f"bf16 vs fp32 over 200 iterations: worst relative loss difference {worst:.2e} (mean {mean:.2e}); "
      f"last losses {a[-1]:.4f} (fp32) {b[-1]:.4f} (bf16)")
assert worst <= 0.01, worst
assert a != b, "the bf16 run computed exactly what fp32 did"
assert b[-1] < 0.8 * b[0], (b[0], b[-1])
PY

# 2. fp16, Megatron's dynamic scaling from 2^32.
small_train --train-iters 40 --seed 7 --fp16 --loss-scale-window 6 --hysteresis 2 --log-interval 1 \
  --metrics-file f16.jsonl > f16.log
grep -q "loss scale: 4294967296.0" f16.log || fail "the first iteration did not log Megatron's initial scale 2^32"
grep -Eq "number of skipped iterations: +[1-9]" f16.log || fail "no skipped iteration was logged"
"$py" - f16.jsonl <<'PY' || fail "fp16's loss scale did not follow Megatron's rule"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l).get("type") == "train"]
# Megatron's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py), from the skipped flags:
scale, growth, hyst = 2.0 ** 32, 0, 2
skipped = 0
for r in rows:
    assert r["loss_scale"] == scale, (r["iteration"], r["loss_scale"], scale)
    if r["skipped"]:
        skipped += 1
        growth, hyst = 0, hyst - 1
        if hyst <= 0:
            scale = max(scale * 0.5, 1.0)
    else:
        growth += 1
        if growth == 6:
            growth, hyst = 0, 2
            scale *= 2.0
first = [r["lm_loss"] for r in rows if not r["skipped"]]
print(f"fp16: {skipped} of {len(rows)} iterations skipped; final scale {rows[-1]['loss_scale']:g}; "
      f"loss {first[0]:.4f} -> {first[-1]:.4f}")
assert skipped >= 2 and skipped < len(rows) // 2, skipped
assert any(not a["skipped"] and b["loss_scale"] > a["loss_scale"] for a, b in zip(rows, rows[1:])), "never grew back"
assert first[-1] < first[0], "the loss did not fall"
PY

# 3. DeepSpeed's fp16 block.
cat > ds.json <<'JSON'
{"train_micro_batch_size_per_gpu": 3, "train_batch_size": 6,
 "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 10,
          "hysteresis": 1, "min_loss_scale": 1}}
JSON
small_train --train-iters 25 --seed 7 --deepspeed-config ds.json --metrics-file ds.jsonl > ds.log
"$py" - ds.jsonl <<'PY' || fail "DeepSpeed's fp16 block: the loss scale did not follow DeepSpeed's rule"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l).get("type") == "train"]
# DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py), hysteresis 1:
scale, last_overflow, it = 256.0, -1, 0
for r in rows:
    assert r["loss_scale"] == scale, (r["iteration"], r["loss_scale"], scale)
    if r["skipped"]:
        scale = max(scale / 2, 1.0)
        last_overflow = it
    elif (it - last_overflow) % 10 == 0:
        scale *= 2
    it += 1
print(f"DeepSpeed fp16: scales {sorted(set(r['loss_scale'] for r in rows))}")
PY

# 4. bf16 checkpoints: fp32 master weights, resumed in fp32 on one rank and in bf16 on pp 2.
small_train --train-iters 6 --exit-interval 3 --seed 7 --bf16 --num-attention-heads 4 --tensor-model-parallel-size 2 \
  --data-parallel-size 2 --zero-stage 2 --save ck > save.log
[[ $(cat ck/latest_checkpointed_iteration.txt) == 3 ]] || fail "the bf16 run did not save iteration 3"
cp -r ck ck2
small_train --train-iters 6 --seed 7 --num-attention-heads 4 --load ck --save ck --metrics-file r32.jsonl > r32.log
grep -q "loaded .*iteration 3" r32.log || fail "the fp32 run did not load the bf16 checkpoint"
small_train --train-iters 6 --seed 7 --bf16 --num-attention-heads 4 --pipeline-model-parallel-size 2 --load ck2 --save ck2 \
  --metrics-file r16.jsonl > r16.log
grep -q "loaded .*iteration 3" r16.log || fail "the bf16 pp 2 run did not load the bf16 checkpoint"
[[ $(losses r32.jsonl | wc -l) == 3 && $(losses r16.jsonl | wc -l) == 3 ]] || fail "the resumed runs did not train 3 iterations"
echo "PASS: mixed precision (bf16 within 1% of fp32 over 200 iterations, fp16 loss scaling, DeepSpeed's block, checkpoints)"
