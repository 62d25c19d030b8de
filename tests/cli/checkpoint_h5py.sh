#!/usr/bin/env bash
# A checkpoint written by `troupe train --save` is plain HDF5 that h5py reads: every parameter under its
# global name with its global shape (wte over the real vocabulary), the AdamW moments, iteration,
# consumed samples, RNG state and the full config; the values equal what `troupe ckpt export` writes.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import h5py, numpy" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks h5py/numpy"; exit 77; }
make_corpus
small_train --train-iters 4 --save ck > /dev/null
"$troupe" ckpt export --load ck --format hf --output hf.h5 > /dev/null
"$py" - <<'PY'
import json, h5py, numpy as np
L, C, V, P = 2, 48, 257, 32
f = h5py.File("ck/iter_0000004/model_optim_rng.h5", "r")
assert f.attrs["iteration"] == 4 and f.attrs["optimizer_step"] == 4, dict(f.attrs)
assert f.attrs["consumed_samples"] == 24, f.attrs["consumed_samples"]
cfg = json.loads(f.attrs["config"])
assert cfg["model"]["num_layers"] == L and cfg["model"]["vocab_size"] == V and cfg["train_iters"] == 4, cfg
rng = json.loads(f.attrs["rng"])
assert rng["seed"] == cfg["seed"], rng
expected = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (P, C),
            "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
for i in range(L):
    h = f"transformer.h.{i}."
    expected.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (3 * C, C),
                     h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                     h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (4 * C, C),
                     h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (C, 4 * C), h + "mlp.c_proj.bias": (C,)})
for group in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
    names = set(f[group].keys())
    assert names == set(expected), (group, names ^ set(expected))
    for name, shape in expected.items():
        d = f[group][name]
        assert d.shape == shape and d.dtype == np.float32, (group, name, d.shape, d.dtype)
        assert np.all(np.isfinite(d[...])), (group, name)
assert np.any(f["optimizer/exp_avg_sq/transformer.wte.weight"][...] > 0)
hf = h5py.File("hf.h5", "r")
w = f["model/transformer.h.1.mlp.c_fc.weight"][...]
assert np.array_equal(hf["transformer.h.1.mlp.c_fc.weight"][...], w.T)
assert np.array_equal(hf["lm_head.weight"][...], f["model/transformer.wte.weight"][...])
print("checkpoint read by h5py: %d tensors x 3 groups, attributes and config OK" % len(expected))
PY
echo PASS
