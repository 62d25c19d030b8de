#!/usr/bin/env bash
# `troupe bench gpt` with the model-family flags (issue 14): a LLaMA given by Megatron's flags and one
# given by --model-preset with overrides train, report the family, a parameter count equal to the
# architecture's counted by hand (below, from the shapes) and the model FLOPs equal to torch_gpt.py's
# Megatron-LM closed form; bad family flags are refused all at once, exit 2.
source "$(dirname "$0")/common.bash"
py=${PYTHON:-/usr/bin/python3}
"$py" -c 'import numpy' 2>/dev/null || { echo "SKIP: $py cannot import numpy (set PYTHON)"; exit 77; }

tiny=(--num-layers 2 --hidden-size 48 --num-attention-heads 6 --seq-length 16 --micro-batch-size 2
      --iters 1 --warmup-iters 0 --num-threads 1 --json)
"$troupe" bench gpt "${tiny[@]}" --vocab-size 200 --normalization RMSNorm --position-embedding-type rope \
  --group-query-attention --num-query-groups 2 --swiglu --ffn-hidden-size 40 --disable-bias-linear \
  --untie-embeddings-and-output-weights > flags.out 2> flags.err || { cat flags.err; fail "the LLaMA bench failed"; }
"$troupe" bench gpt "${tiny[@]}" --model-preset llama2-7b --num-key-value-heads 3 --ffn-hidden-size 24 \
  --vocab-size 100 > preset.out 2> preset.err || { cat preset.err; fail "the preset bench failed"; }

"$py" - "$src_dir/bench" flags.out preset.out <<'PY' || fail "the bench's counts are not the model's"
import json, math, sys
sys.path.insert(0, sys.argv[1])
import torch_gpt

def last_json(path):
    return [json.loads(l) for l in open(path) if l.startswith("{")][-1]

def params(V, C, L, H, G, F):  # LLaMA: embedding, per layer 2 RMSNorms, q k v o, SwiGLU, final norm, untied head
    hd = C // H
    layer = 2 * C + C * (H + 2 * G) * hd + H * hd * C + C * 2 * F + F * C
    return V * C + L * layer + C + V * C

for path, V, G, F in ((sys.argv[2], 200, 2, 40), (sys.argv[3], 100, 3, 24)):
    j = last_json(path)
    assert j["family"] == "LLaMA", (path, j["family"])
    assert j["parameters"] == params(V, 48, 2, 6, G, F), (path, j["parameters"], params(V, 48, 2, 6, G, F))
    want = torch_gpt.model_flops_per_iter(2, 16, 2, 48, V, 6, G, F, swiglu=True)
    assert abs(j["model_flops_per_iter"] - want) <= 1e-12 * want, (path, j["model_flops_per_iter"], want)
    assert math.isfinite(j["final_loss"]) and j["tokens_per_sec"] > 0, j
PY

rc=0
"$troupe" bench gpt --num-attention-heads 6 --normalization foo --group-query-attention --num-query-groups 4 \
  --iters 0 --json > bad.out 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "bad family flags exited $rc, expected 2"
for want in "--normalization foo" "--num-query-groups 4 does not divide" "--iters"; do
  grep -qF -- "$want" bad.out || { cat bad.out; fail "the refusal does not name '$want'"; }
done
grep -q "3 problems" bad.out || { cat bad.out; fail "the problems were not reported at once"; }
echo "PASS: bench_family"
