#!/usr/bin/env bash
# Resuming is exact (issue 5): 20 iterations straight equal 10, stop, resume, 10 more -- bitwise on
# the layout that saved (tp 2 x pp 2 x dp 2, ZeRO-3: losses, gradient norms, learning rates and the
# final checkpoint's evaluation), and within 1e-5 relative when the 10 more run on another layout
# (1x1x1; tp 4 with ZeRO-1 and the gpipe schedule).
source "$(dirname "$0")/common.bash"
make_corpus

args=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 24 --micro-batch-size 2
      --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2
      --train-iters 20 --weight-decay 0.1 --clip-grad 1.0 --data-path d_text_document
      --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --log-interval 1000 --num-threads 1)
tiny() { "$troupe" train "${args[@]}" "$@"; }
layout=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 3)

tiny "${layout[@]}" --metrics-file straight.jsonl --save straight > straight.log 2>&1 || { cat straight.log; fail "straight run"; }
tiny "${layout[@]}" --metrics-file resumed.jsonl --exit-interval 10 --save half > first.log 2>&1 || { cat first.log; fail "first half"; }
[[ $(cat half/latest_checkpointed_iteration.txt) == 10 ]] || fail "no checkpoint at iteration 10"
cp -r half half_copy  # the other layouts resume from the same iteration-10 checkpoint
tiny "${layout[@]}" --metrics-file resumed.jsonl --load half --save half > second.log 2>&1 || { cat second.log; fail "second half"; }
grep -q "loaded half/iter_0000010" second.log || fail "the second half did not load iteration 10"
losses straight.jsonl > a.txt
losses resumed.jsonl > b.txt
[[ $(wc -l < a.txt) == 20 ]] || fail "expected 20 iterations in the straight run"
diff a.txt b.txt || fail "10 + 10 on the same layout is not bitwise the 20 straight iterations"
ea=$("$troupe" eval --load straight --data-path d_text_document --eval-samples 30 --json)
eb=$("$troupe" eval --load half --data-path d_text_document --eval-samples 30 --json)
[[ "${ea/straight/X}" == "${eb/half/X}" ]] || fail "the final checkpoints evaluate differently: $ea vs $eb"

# Another layout for the last 10: within 1e-5 of the straight run, iteration by iteration.
within() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def read(path):
    return {j["iteration"]: (j["lm_loss"], j["grad_norm"]) for j in map(json.loads, open(path)) if j.get("type") == "train"}
ref, got = read(sys.argv[1]), read(sys.argv[2])
assert sorted(got) == list(range(11, 21)), f"iterations {sorted(got)}, expected 11..20"
for it in sorted(got):
    for k, name in enumerate(("loss", "gradient norm")):
        rel = abs(got[it][k] - ref[it][k]) / abs(ref[it][k])
        assert rel <= 1e-5, f"iteration {it}: {name} {got[it][k]!r} vs straight {ref[it][k]!r} (relative {rel:.2e})"
print(f"{sys.argv[2]}: iterations 11-20 within 1e-5 of the straight run")
PY
}
tiny --load half_copy --metrics-file one.jsonl > one.log 2>&1 || { cat one.log; fail "resume on 1x1x1"; }
within straight.jsonl one.jsonl || fail "resumed on 1x1x1: not within 1e-5"
tiny --load half_copy --tensor-model-parallel-size 4 --zero-stage 1 --pipeline-schedule gpipe --metrics-file tp4.jsonl \
  > tp4.log 2>&1 || { cat tp4.log; fail "resume on tp 4"; }
within straight.jsonl tp4.jsonl || fail "resumed on tp 4: not within 1e-5"
echo PASS
