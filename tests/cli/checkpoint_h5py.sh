#!/usr/bin/env bash
# A checkpoint written by `troupe train --save` (one rank: format version 3, one shard of whole
# tensors plus metadata.json; docs/CHECKPOINT.md) is plain HDF5 and JSON that h5py and Python read:
# every parameter under its global name with its global shape attribute and index runs (wte over the
# real vocabulary), the AdamW moments, CRC-32 checksums that match the bytes, and iteration, consumed
# samples, RNG state and the full config in metadata.json; the shard's integrity header (a 512-byte
# HDF5 user block) records its length and the CRC-32 of the rest, as metadata.json does; the values
# equal what `troupe ckpt export` writes.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import h5py, numpy" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks h5py/numpy"; exit 77; }
make_corpus
small_train --train-iters 4 --save ck > /dev/null
"$troupe" ckpt export --load ck --format hf-h5 --output hf.h5 > /dev/null
"$py" - <<'PY'
import json, zlib, h5py, numpy as np
L, C, V, P = 2, 48, 257, 32
meta = json.load(open("ck/iter_0000004/metadata.json"))
assert meta["format"] == "troupe-checkpoint" and meta["format_version"] == 3, meta
assert meta["iteration"] == 4 and meta["optimizer_step"] == 4 and meta["consumed_samples"] == 24, meta
assert [s["file"] for s in meta["shards"]] == ["shard_00000.h5"], meta["shards"]
raw = open("ck/iter_0000004/shard_00000.h5", "rb").read()
import struct
magic, hversion, hbytes, total, crc = struct.unpack("<8sIIQI", raw[:28])
assert magic == b"TRPSHARD" and hversion == 1 and hbytes == 512, raw[:32]
assert total == len(raw) == meta["shards"][0]["bytes"], (total, len(raw))
assert crc == zlib.crc32(raw[512:]) == meta["shards"][0]["crc32"], "whole-file checksum"
cfg = json.loads(meta["config"])
assert cfg["model"]["num_layers"] == L and cfg["model"]["vocab_size"] == V and cfg["train_iters"] == 4, cfg
assert json.loads(meta["rng"])["seed"] == cfg["seed"]
assert open("ck/latest_checkpointed_iteration.txt").read().strip() == "4"
f = h5py.File("ck/iter_0000004/shard_00000.h5", "r")
assert f.userblock_size == 512
assert f.attrs["format"] == "troupe-checkpoint-shard" and f.attrs["format_version"] == 3 and f.attrs["rank"] == 0
expected = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (P, C),
            "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
for i in range(L):
    h = f"transformer.h.{i}."
    expected.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (3 * C, C),
                     h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                     h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (4 * C, C),
                     h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (C, 4 * C), h + "mlp.c_proj.bias": (C,)})
def tensor(group, name):
    d = f[group][name]
    shape = tuple(json.loads(d.attrs["global_shape"]))
    runs = f[group][name + ".runs"][...]
    assert runs.tolist() == [[0, int(np.prod(shape))]], (name, runs)  # one piece: the whole tensor
    values = d[...]
    assert values.dtype == np.float32 and values.shape == (int(np.prod(shape)),), (name, values.shape)
    assert zlib.crc32(values.astype("<f4").tobytes()) == d.attrs["crc32"], (group, name, "checksum")
    return shape, values.reshape(shape)
for group in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
    names = {k for k in f[group].keys() if not k.endswith(".runs")}
    assert names == set(expected), (group, names ^ set(expected))
    for name, shape in expected.items():
        got_shape, values = tensor(group, name)
        assert got_shape == shape, (group, name, got_shape)
        assert np.all(np.isfinite(values)), (group, name)
assert np.any(tensor("optimizer/exp_avg_sq", "transformer.wte.weight")[1] > 0)
hf = h5py.File("hf.h5", "r")
w = tensor("model", "transformer.h.1.mlp.c_fc.weight")[1]
assert np.array_equal(hf["transformer.h.1.mlp.c_fc.weight"][...], w.T)
assert np.array_equal(hf["lm_head.weight"][...], tensor("model", "transformer.wte.weight")[1])
print("checkpoint read by h5py: %d tensors x 3 groups, checksums, runs, metadata and config OK" % len(expected))
PY
echo PASS
