#!/usr/bin/env bash
# Mixtral through Hugging Face folders end to end, without training flags (docs/MODELS.md, "Mixtral"): a
# tiny MixtralForCausalLM folder written here in Python (4 experts, top-2, GQA 4:2, untied) is imported with
# `troupe ckpt import --format hf` (the MoE model: Megatron-Core's router without pre-softmax, dropless);
# `troupe eval` of the imported checkpoint (float32, the engine's MoE layers) equals bench/torch_gpt.py's
# own float64 Mixtral (written from HF's published semantics) within fp32 rounding (1e-6 relative; the
# float64 comparison within 1e-9 is tests/storage/test_hf_mixtral.cpp's); `troupe ckpt export --format hf`
# gives back every tensor bitwise and Mixtral's config keys; a folder HF's Mixtral and troupe's model
# disagree on (router jitter) is refused with exit 2. Training a Mixtral with Megatron-LM's MoE flags:
# tests/cli/hf_mixtral_train.sh.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import torch, numpy" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks torch/numpy"; exit 77; }
make_corpus

"$py" - hf <<'PY' || fail "writing the Mixtral folder failed"
import json, os, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out)
C, L, H, G, hd, F, E, V = 48, 2, 4, 2, 12, 40, 4, 257
rng = np.random.RandomState(0)
w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C)), "lm_head.weight": rng.normal(0, 0.2, (V, C)),
     "model.norm.weight": 1 + rng.normal(0, 0.1, C)}
for i in range(L):
    p = f"model.layers.{i}."
    w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
    w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
    w[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.15, (H * hd, C))
    w[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.15, (G * hd, C))
    w[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.15, (G * hd, C))
    w[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.15, (C, H * hd))
    w[p + "block_sparse_moe.gate.weight"] = rng.normal(0, 0.5, (E, C))
    for e in range(E):
        x = f"{p}block_sparse_moe.experts.{e}."
        w[x + "w1.weight"] = rng.normal(0, 0.15, (F, C))
        w[x + "w2.weight"] = rng.normal(0, 0.15, (C, F))
        w[x + "w3.weight"] = rng.normal(0, 0.15, (F, C))
header, blobs, offset = {}, [], 0
for name in sorted(w):
    a = np.ascontiguousarray(w[name], dtype="<f4")
    header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
    blobs.append(a.tobytes())
    offset += a.nbytes
header["__metadata__"] = {"format": "pt"}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": C,
          "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": G,
          "max_position_embeddings": 64, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "num_local_experts": E, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
          "router_jitter_noise": 0.0, "sliding_window": None, "tie_word_embeddings": False, "hidden_act": "silu",
          "bos_token_id": 256, "eos_token_id": 256, "torch_dtype": "float32",
          "troupe": {"tokenizer_type": "ByteLevelTokenizer", "seq_length": 32}}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
PY

"$troupe" ckpt import --format hf --input hf --save ck > import.log 2>&1 || { cat import.log; fail "import failed"; }
grep -q MixtralForCausalLM import.log || { cat import.log; fail "the import does not name MixtralForCausalLM"; }
"$troupe" ckpt info ck > info.log 2>&1 || { cat info.log; fail "ckpt info failed"; }
grep -q "mlp.experts.3.c_fc.weight" info.log || { cat info.log; fail "the checkpoint holds no experts"; }

"$troupe" eval --load ck --data-path d_text_document --eval-samples 20 --json > eval.json 2> eval.err ||
  { cat eval.err; fail "troupe eval of the imported Mixtral failed"; }
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
assert int(t["tokens"]) == int(p["tokens"]), (t, p)
PY

"$troupe" ckpt export --load ck --format hf --output back > export.log 2>&1 || { cat export.log; fail "export failed"; }
grep -q MixtralForCausalLM export.log || fail "the export does not name MixtralForCausalLM"
"$py" - hf back "$src_dir/bench" <<'PY' || fail "HF -> troupe -> HF is not bitwise, or config.json is not Mixtral's"
import json, sys
sys.path.insert(0, sys.argv[3])
from torch_gpt import read_safetensors
a = read_safetensors(sys.argv[1] + "/model.safetensors")
b = read_safetensors(sys.argv[2] + "/model.safetensors")
assert sorted(a) == sorted(b), set(a) ^ set(b)
for n in a:
    assert a[n].shape == b[n].shape and a[n].tobytes() == b[n].tobytes(), n
c = json.load(open(sys.argv[2] + "/config.json"))
assert c["architectures"] == ["MixtralForCausalLM"] and c["model_type"] == "mixtral", c
for key, want in {"num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
                  "intermediate_size": 40, "num_key_value_heads": 2, "head_dim": 12, "hidden_size": 48,
                  "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                  "sliding_window": None, "vocab_size": 257, "max_position_embeddings": 64}.items():
    assert c[key] == want, (key, c[key], want)
assert c["troupe"]["moe"]["load_balancing"] == "aux_loss", c["troupe"]
PY

# A router HF's Mixtral and troupe's model disagree on is refused, naming the key, with exit 2.
cp -r hf jitter
"$py" -c 'import json,sys; c=json.load(open(sys.argv[1])); c["router_jitter_noise"]=0.1; json.dump(c,open(sys.argv[1],"w"))' \
  jitter/config.json
set +e
"$troupe" ckpt import --format hf --input jitter --save ck_jitter > jitter.log 2>&1
rc=$?
set -e
[[ $rc == 2 ]] || { cat jitter.log; fail "importing a jittered router exited $rc, not 2"; }
grep -q router_jitter_noise jitter.log || { cat jitter.log; fail "the refusal does not name router_jitter_noise"; }
echo PASS
