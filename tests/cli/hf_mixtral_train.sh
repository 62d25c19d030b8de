#!/usr/bin/env bash
# A Mixtral trained by troupe with Megatron-LM's MoE flags, end to end through Hugging Face (docs/MODELS.md,
# "Mixtral"): a tiny LLaMA-family model with 4 SwiGLU experts, top-2 (Megatron-Core's router, dropless) in
# every layer trains a few iterations, `troupe ckpt export --format hf` writes a MixtralForCausalLM folder
# whose loss in bench/torch_gpt.py's float64 Mixtral equals `troupe eval`'s within fp32 rounding (1e-6),
# `troupe ckpt import` gives back every parameter bitwise, and the same model trained with
# --moe-router-pre-softmax is refused by the export with exit 2 (HF's Mixtral renormalises the top k).
# Skipped (77) while `troupe train` does not take the MoE flags (they come with the MoE flags' branch);
# tests/cli/hf_mixtral.sh and tests/storage/test_hf_mixtral.cpp cover the same ground without them.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import torch, numpy, h5py" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks torch/numpy/h5py"; exit 77; }
make_corpus

mixtral=(--normalization RMSNorm --position-embedding-type rope --swiglu --disable-bias-linear
         --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 1 --ffn-hidden-size 40
         --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01 --hidden-dropout 0 --attention-dropout 0)

if ! small_train --train-iters 4 --save ck --num-threads 1 "${mixtral[@]}" > train.log 2>&1; then
  # A troupe train that refuses the MoE flags as not built yet (or does not know them) skips the test.
  unsupported="mixture of experts is not (in troupe|wired into the engine) yet|not expected: --num-experts"
  if grep -Eq "$unsupported" train.log; then
    echo "SKIP: troupe train does not train with Megatron-LM's MoE flags here:"
    grep -E "$unsupported" train.log | head -3
    exit 77
  fi
  cat train.log
  fail "training the Mixtral failed"
fi
"$troupe" ckpt export --load ck --format hf --output hf > export.log 2>&1 || { cat export.log; fail "export failed"; }
grep -q MixtralForCausalLM export.log || fail "the export does not name MixtralForCausalLM"
"$py" - hf/config.json <<'PY' || fail "config.json is not Mixtral's"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["MixtralForCausalLM"] and c["model_type"] == "mixtral", c
assert c["num_local_experts"] == 4 and c["num_experts_per_tok"] == 2 and c["router_aux_loss_coef"] == 0.01, c
assert c["intermediate_size"] == 40 and c["num_key_value_heads"] == 1 and c["tie_word_embeddings"] is False, c
PY
"$troupe" eval --load ck --data-path d_text_document --eval-samples 20 --json > eval.json 2> /dev/null ||
  fail "troupe eval failed"
"$py" "$src_dir/bench/torch_gpt.py" eval --hf-dir hf --data-prefix d_text_document --seq-length 32 --samples 20 \
  --double --threads 1 > torch.json || fail "the PyTorch oracle failed"
"$py" - eval.json torch.json <<'PY' || fail "losses differ"
import json, math, sys
def last(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")][-1]
t, p = last(sys.argv[1]), last(sys.argv[2])
lt, lp = float(t["loss"]), float(p["loss"])
print(f"mixtral: troupe {lt:.10f}  pytorch (float64) {lp:.10f}  relative {abs(lt - lp) / lp:.2e}")
assert math.isfinite(lt) and abs(lt - lp) <= 1e-6 * lp, (lt, lp)
PY
"$troupe" ckpt import --format hf --input hf --save back > /dev/null || fail "import failed"
"$py" - ck/iter_0000004/shard_00000.h5 back/iter_0000000/shard_00000.h5 <<'PY' || fail "export -> import is not bitwise"
import h5py, sys
a, b = h5py.File(sys.argv[1], "r")["model"], h5py.File(sys.argv[2], "r")["model"]
names = sorted(n for n in a if not n.endswith(".runs"))
assert names == sorted(n for n in b if not n.endswith(".runs")), "tensor sets differ"
assert any(".mlp.experts.3." in n for n in names), "no experts"
for n in names:
    assert a[n][...].tobytes() == b[n][...].tobytes(), n
PY

# Pre-softmax weights are not renormalised: no Mixtral. Refused by the export, exit 2, nothing written.
small_train --train-iters 4 --save ck_pre --num-threads 1 "${mixtral[@]}" --moe-router-pre-softmax > /dev/null 2>&1 ||
  fail "training the pre-softmax model failed"
set +e
"$troupe" ckpt export --load ck_pre --format hf --output hf_pre > pre.log 2>&1
rc=$?
set -e
[[ $rc == 2 ]] || { cat pre.log; fail "exporting a pre-softmax router exited $rc, not 2"; }
grep -q "MixtralForCausalLM" pre.log && grep -q "pre-softmax" pre.log || { cat pre.log; fail "the refusal names no reason"; }
[[ ! -e hf_pre ]] || fail "a refused export wrote hf_pre"
echo PASS
