#!/usr/bin/env bash
# Hugging Face in and out (docs/CHECKPOINT.md, "Hugging Face folders"): a tiny model trained by troupe is
# exported with `troupe ckpt export --format hf`; the folder is read back by a safetensors reader written
# here in the Python standard library (length-prefixed JSON header, raw little-endian bytes) and its loss,
# computed by an independent PyTorch GPT-2 written here against HF's names and Conv1D orientation (float64),
# equals `troupe eval`'s. `troupe ckpt import --format hf` gives back the checkpoint's parameters bitwise,
# also from F16/BF16, sharded and GPT2Model-named folders; GPT-2 BPE tokenizer files travel with the folder; `troupe train --load HF_FOLDER` (a fine-tune)
# trains on pp 2 exactly as --finetune from the imported or the original checkpoint does; folders that are
# not GPT-2, or hostile, are refused with exit 2 and nothing written.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import torch, h5py, numpy" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks torch/h5py/numpy"; exit 77; }
make_corpus
small_train --train-iters 4 --save ck --num-threads 1 > /dev/null
"$troupe" ckpt export --load ck --format hf --output hf > /dev/null
for f in config.json model.safetensors generation_config.json; do [[ -s hf/$f ]] || fail "export wrote no hf/$f"; done
[[ ! -e hf/vocab.json ]] || fail "a ByteLevelTokenizer run has no vocab.json to copy"
"$troupe" eval --load ck --data-path d_text_document --eval-samples 20 --json > eval.json 2> /dev/null

# The reader, the model and the loss: nothing here comes from troupe's code.
cat > hfcheck.py <<'PY'
import json, math, struct, sys

def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert 2 <= n <= len(raw) - 8, n
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    assert isinstance(header, dict)
    buf = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    end = 0
    size = {"F32": 4, "F16": 2, "BF16": 2}
    out = {}
    for name, e in entries:
        b, f = e["data_offsets"]
        assert b == end and f >= b, (name, b, end)  # the tensors tile the buffer
        count = math.prod(e["shape"])
        assert f - b == count * size[e["dtype"]], name
        out[name] = (e["dtype"], e["shape"], buf[b:f])
        end = f
    assert end == len(buf), (end, len(buf))
    return meta, out

def write_safetensors(path, tensors, metadata=None):  # name -> (dtype, shape, bytes), in order
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors.values()))

def expected_shapes(c):
    L, C, V, P = c["n_layer"], c["n_embd"], c["vocab_size"], c["n_positions"]
    s = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C],
         "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    for i in range(L):
        h = f"transformer.h.{i}."
        s.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C], h + "attn.c_attn.weight": [C, 3 * C],
                  h + "attn.c_attn.bias": [3 * C], h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                  h + "ln_2.weight": [C], h + "ln_2.bias": [C], h + "mlp.c_fc.weight": [C, 4 * C],
                  h + "mlp.c_fc.bias": [4 * C], h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
    return s

def tokens(prefix):  # Megatron's MMIDIDX .idx/.bin, all documents back to back
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, n, d = struct.unpack("<QBQQ", idx[9:34])
    sizes = struct.unpack(f"<{n}i", idx[34:34 + 4 * n])
    width, fmt = {8: (2, "H"), 4: (4, "i"), 1: (1, "B")}[code]
    data = open(prefix + ".bin", "rb").read()
    return list(struct.unpack(f"<{sum(sizes)}{fmt}", data[:sum(sizes) * width]))

def loss(folder, prefix, seq, samples):
    import torch
    c = json.load(open(folder + "/config.json"))
    _, raw = read_safetensors(folder + "/model.safetensors")
    w = {k: torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(s).double() for k, (d, s, b) in raw.items()}
    C, H, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    def ln(x, p):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) / torch.sqrt(v + eps) * w[p + ".weight"] + w[p + ".bias"]
    def conv1d(x, p):  # HF's Conv1D: weight (in, out)
        return x @ w[p + ".weight"] + w[p + ".bias"]
    def gelu_new(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    stream = tokens(prefix)
    total, count = 0.0, 0
    for k in range(samples):
        win = torch.tensor(stream[k * seq: k * seq + seq + 1])
        x = w["transformer.wte.weight"][win[:-1]] + w["transformer.wpe.weight"][:seq]
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        for i in range(c["n_layer"]):
            h = f"transformer.h.{i}."
            q, kk, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=-1)  # [q | k | v]
            heads = lambda t: t.reshape(seq, H, C // H).transpose(0, 1)
            att = heads(q) @ heads(kk).transpose(-1, -2) / math.sqrt(C // H)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ heads(v)).transpose(0, 1).reshape(seq, C)
            x = x + conv1d(y, h + "attn.c_proj")
            x = x + conv1d(gelu_new(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
        logits = ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T  # tied head
        total += float(torch.nn.functional.cross_entropy(logits, win[1:], reduction="sum"))
        count += seq
    return total / count, count

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "check":  # the folder's files, then the loss against troupe eval's
        folder, prefix, eval_json = sys.argv[2:5]
        c = json.load(open(folder + "/config.json"))
        assert c["model_type"] == "gpt2" and c["architectures"] == ["GPT2LMHeadModel"], c
        assert (c["n_layer"], c["n_embd"], c["n_head"], c["n_positions"], c["vocab_size"]) == (2, 48, 3, 32, 257), c
        assert c["activation_function"] == "gelu_new" and c["tie_word_embeddings"] is True and c["n_inner"] is None
        assert c["layer_norm_epsilon"] == 1e-5 and c["eos_token_id"] == 256 and c["torch_dtype"] == "float32"
        g = json.load(open(folder + "/generation_config.json"))
        assert g["eos_token_id"] == g["bos_token_id"] == 256, g
        meta, raw = read_safetensors(folder + "/model.safetensors")
        assert meta == {"format": "pt"}, meta
        shapes = expected_shapes(c)
        assert set(raw) == set(shapes), set(raw) ^ set(shapes)  # lm_head.weight omitted: tied, as save_pretrained
        for name, (dtype, shape, _) in raw.items():
            assert dtype == "F32" and shape == shapes[name], (name, dtype, shape)
        t = json.load(open(eval_json))
        lp, n = loss(folder, prefix, 32, 20)
        lt = float(t["loss"])
        print(f"troupe eval {lt:.10f}, PyTorch on the exported folder {lp:.10f} (float64), {n} tokens")
        assert int(t["tokens"]) == n, (t, n)
        assert abs(lt - lp) <= 1e-5 * lp, (lt, lp)
    elif what == "variants":  # F16, BF16, sharded and GPT2Model-named copies of a folder
        folder = sys.argv[2]
        meta, raw = read_safetensors(folder + "/model.safetensors")
        def narrowed(kind):
            out = {}
            for name, (d, s, b) in raw.items():
                vals = struct.unpack(f"<{len(b) // 4}f", b)
                if kind == "F16":
                    out[name] = ("F16", s, struct.pack(f"<{len(vals)}e", *vals))
                else:  # bfloat16: the upper half of each float32 (truncated)
                    bits = struct.unpack(f"<{len(vals)}I", b)
                    out[name] = ("BF16", s, struct.pack(f"<{len(vals)}H", *[x >> 16 for x in bits]))
            return out
        import os, shutil
        for kind in ("F16", "BF16"):
            os.makedirs(f"hf_{kind}", exist_ok=True)
            shutil.copy(folder + "/config.json", f"hf_{kind}/config.json")
            write_safetensors(f"hf_{kind}/model.safetensors", narrowed(kind), meta)
        # Sharded in two files with an index; GPT2Model's names (no "transformer."), old mask buffers, lm_head.
        os.makedirs("hf_sharded", exist_ok=True)
        shutil.copy(folder + "/config.json", "hf_sharded/config.json")
        names = list(raw)
        bare = {n[len("transformer."):]: raw[n] for n in names}
        c = json.load(open(folder + "/config.json"))
        for i in range(c["n_layer"]):
            P = c["n_positions"]
            bare[f"h.{i}.attn.bias"] = ("F32", [1, 1, P, P], struct.pack(f"<{P * P}f", *([1.0] * (P * P))))
        bare["lm_head.weight"] = raw["transformer.wte.weight"]
        keys = list(bare)
        parts = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
                 "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
        weight_map = {}
        for file, ks in parts.items():
            write_safetensors("hf_sharded/" + file, {k: bare[k] for k in ks}, {"format": "pt"})
            weight_map.update({k: file for k in ks})
        json.dump({"metadata": {"total_size": sum(len(v[2]) for v in bare.values())}, "weight_map": weight_map},
                  open("hf_sharded/model.safetensors.index.json", "w"))
    elif what == "same_params":  # two troupe shards: every model tensor bitwise equal (h5py); or widened F16/BF16
        import h5py, numpy as np
        a, b, kind = sys.argv[2], sys.argv[3], sys.argv[4]
        fa, fb = h5py.File(a, "r"), h5py.File(b, "r")
        names = [n for n in fa["model"] if not n.endswith(".runs")]
        assert sorted(names) == sorted(n for n in fb["model"] if not n.endswith(".runs")), "tensor sets differ"
        for n in names:
            x, y = fa["model"][n][...], fb["model"][n][...]
            if kind == "F16":
                x = x.astype(np.float16).astype(np.float32)
            elif kind == "BF16":
                x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
            assert x.dtype == y.dtype == np.float32 and x.tobytes() == y.tobytes(), (n, kind)
        print(f"{len(names)} tensors equal ({kind})")
PY

"$py" hfcheck.py check hf d_text_document eval.json || fail "the exported folder or its loss"
"$troupe" ckpt import --format hf --input hf --save ck2 > /dev/null
"$py" hfcheck.py same_params ck/iter_0000004/shard_00000.h5 ck2/iter_0000000/shard_00000.h5 F32 ||
  fail "export -> import is not bitwise"
"$troupe" eval --load ck2 --data-path d_text_document --eval-samples 20 --json > eval2.json 2> /dev/null
cmp <("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' eval.json) \
    <("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' eval2.json) ||
  fail "the imported checkpoint evaluates differently"

"$py" hfcheck.py variants hf
for kind in F16 BF16 sharded; do
  "$troupe" ckpt import --format hf --input "hf_$kind" --save "ck_$kind" > /dev/null || fail "import of hf_$kind"
  expect=$([[ $kind == sharded ]] && echo F32 || echo "$kind")
  "$py" hfcheck.py same_params ck/iter_0000004/shard_00000.h5 "ck_$kind/iter_0000000/shard_00000.h5" "$expect" ||
    fail "import of hf_$kind"
done

# Fine-tuning: from the folder, from the imported checkpoint and from the original one, on pp 2: a new run at
# iteration 0 with fresh optimizer state, the same losses every way.
finetune() {
  small_train --train-iters 4 --log-interval 1 --pipeline-model-parallel-size 2 --num-threads 1 "$@" 2>&1 |
    grep '^ *iteration ' | grep -o 'lm loss: [0-9.E+-]*'
}
finetune --load hf --save ft > ft_hf.log
finetune --load ck2 --finetune > ft_ck2.log
finetune --load ck --finetune > ft_ck.log
[[ $(wc -l < ft_hf.log) == 4 ]] || fail "the fine-tune from the folder did not train 4 iterations: $(cat ft_hf.log)"
cmp ft_hf.log ft_ck2.log && cmp ft_hf.log ft_ck.log || fail "fine-tunes from the same weights differ"
"$py" - <<'PY' || fail "the fine-tune's checkpoint"
import json
m = json.load(open("ft/iter_0000004/metadata.json"))
assert m["iteration"] == 4 and m["optimizer_step"] == 4 and m["consumed_samples"] == 24, m
src = json.load(open("ck/iter_0000004/metadata.json"))
assert m["run"]["id"] != src["run"]["id"], "a fine-tune is a new run"
PY

# --no-load-optim: the iteration continues, the moments and Adam's step count start afresh.
small_train --train-iters 6 --load ck --no-load-optim --override-opt_param-scheduler --save ck_noopt --num-threads 1 > /dev/null
"$py" -c 'import json; m = json.load(open("ck_noopt/iter_0000006/metadata.json")); assert (m["iteration"], m["optimizer_step"]) == (6, 2), m' ||
  fail "--no-load-optim's checkpoint"

# GPT-2's BPE: the run's --vocab-file and --merge-file travel with the folder (copied byte for byte, with a
# tokenizer_config.json and the tokenizer's end-of-document id as eos), and train from there.
vocab=$src_dir/fuzz/data/gpt2_tiny/encoder.json merges=$src_dir/fuzz/data/gpt2_tiny/vocab.bpe
bpe=(--tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges")
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix b "${bpe[@]}" \
  --append-eod > /dev/null
small_train --train-iters 4 --data-path b_text_document "${bpe[@]}" --save ckb --num-threads 1 > /dev/null
"$troupe" ckpt export --load ckb --format hf --output hfb > /dev/null
cmp "$vocab" hfb/vocab.json && cmp "$merges" hfb/merges.txt || fail "the tokenizer files were not copied as they are"
"$py" - "$vocab" <<'PY' || fail "the BPE folder's config"
import json, sys
eod = json.load(open(sys.argv[1]))["<|endoftext|>"]
c, t = json.load(open("hfb/config.json")), json.load(open("hfb/tokenizer_config.json"))
assert c["eos_token_id"] == c["bos_token_id"] == eod and c["vocab_size"] == len(json.load(open(sys.argv[1]))), c
assert t["tokenizer_class"] == "GPT2Tokenizer" and t["eos_token"] == "<|endoftext|>", t
PY
small_train --train-iters 4 --data-path b_text_document --tokenizer-type GPT2BPETokenizer \
  --vocab-file hfb/vocab.json --merge-file hfb/merges.txt --load hfb --num-threads 1 > /dev/null ||
  fail "fine-tuning from the BPE folder with its own tokenizer files"
"$troupe" ckpt import --format hf --input hfb --save ckb2 > /dev/null
"$py" -c 'import json; c = json.loads(json.load(open("ckb2/iter_0000000/metadata.json"))["config"]); assert c["tokenizer_type"] == "GPT2BPETokenizer" and c["vocab_file"].endswith("hfb/vocab.json"), c' ||
  fail "the imported checkpoint does not name the folder's tokenizer"

# Refusals: every problem at once, exit 2, nothing written.
mkdir llama && "$py" - <<'PY'
import json
c = json.load(open("hf/config.json"))
c.update(model_type="mistral", architectures=["MistralForCausalLM"], activation_function="silu")
json.dump(c, open("llama/config.json", "w"))
PY
cp hf/model.safetensors llama/
set +e
"$troupe" ckpt import --format hf --input llama --save out_llama > llama.log 2>&1; rc=$?
set -e
[[ $rc == 2 ]] || fail "a Mistral config: exit $rc, not 2"
for word in model_type architectures activation_function; do grep -q "$word" llama.log || fail "no $word in: $(cat llama.log)"; done
[[ ! -e out_llama ]] || fail "a refused import wrote out_llama"

mkdir hostile && cp hf/config.json hostile/
"$py" -c 'import struct; open("hostile/model.safetensors","wb").write(struct.pack("<Q", 1 << 40) + b"{}")'
set +e
"$troupe" ckpt import --format hf --input hostile --save out_hostile > hostile.log 2>&1; rc=$?
small_train --train-iters 1 --load hostile --num-threads 1 > hostile_train.log 2>&1; rc2=$?
"$troupe" ckpt export --load ck --format hf --output x.h5 > h5name.log 2>&1; rc3=$?
set -e
[[ $rc == 2 && $rc2 == 2 ]] || fail "a header length beyond the file: exit $rc / $rc2, not 2: $(cat hostile.log hostile_train.log)"
grep -q "beyond the file" hostile.log || fail "no reason given: $(cat hostile.log)"
[[ ! -e out_hostile ]] || fail "a refused import wrote out_hostile"
[[ $rc3 == 2 ]] && grep -q "hf-h5" h5name.log && [[ ! -e x.h5 ]] || fail "--format hf with an .h5 output: $(cat h5name.log)"
echo PASS
