#!/usr/bin/env bash
# The model families' tokenizers end to end (docs/TOKENIZERS.md): SentencePiece models trained here by
# python3-sentencepiece and tokenizer.json folders in the LLaMA-3, BLOOM and GPT-2 layouts (a tiny
# byte-level BPE trained in tests/storage/tokenizer_oracle.py). `troupe preprocess --tokenizer-type X
# --tokenizer-model Y` writes datasets whose tokens, read by an independent numpy reader, are the
# oracles' ids (python3-sentencepiece; an independent BPE over the file's own merges and regex) with
# Megatron's --append-eod; `troupe train` accepts each, with the vocabulary size the tokenizer has; a
# corrupt model or an unsupported tokenizer.json is bad input: one message, exit 2, nothing written.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import sentencepiece, regex, numpy" 2> /dev/null ||
  { echo "SKIP: /usr/bin/python3 lacks sentencepiece/regex/numpy (scripts/setup.sh installs them)"; exit 77; }
"$py" "$src_dir/tests/storage/tokenizer_oracle.py" all fx 77
"$py" - <<'PY'
import json
texts = json.load(open("fx/texts.json"))
with open("in.jsonl", "w") as f:
    for t in texts * 3:  # enough tokens for a few samples of 32
        f.write(json.dumps({"text": t}) + "\n")
PY

declare -A type=([gptsp]=GPTSentencePieceTokenizer [llama2]=Llama2Tokenizer [llama3]=HuggingFaceTokenizer
                 [bloom]=HuggingFaceTokenizer [gpt2]=HuggingFaceTokenizer)
declare -A model=([gptsp]=fx/unigram.model [llama2]=fx/bpe.model [llama3]=fx/llama3 [bloom]=fx/bloom/tokenizer.json
                  [gpt2]=fx/gpt2)
for name in gptsp llama2 llama3 bloom gpt2; do
  "$troupe" preprocess --input in.jsonl --output-prefix "$name" --tokenizer-type "${type[$name]}" \
    --tokenizer-model "${model[$name]}" --append-eod --workers 2 > /dev/null
  "$py" - "$name" <<'PY' || fail "$name: the dataset's tokens are not the oracle's"
import json, struct, sys
import numpy as np
name = sys.argv[1]
want = json.load(open("fx/expected.json"))[name]
docs = [d + [want["eod"]] for d in want["ids"] * 3 if d]
# The .idx header, then sizes and pointers, as Megatron's MMapIndexedDataset reads them.
raw = open(name + "_text_document.idx", "rb").read()
assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", raw[9:17])[0] == 1
code = raw[17]
n = struct.unpack("<Q", raw[18:26])[0]
sizes = np.frombuffer(raw, np.int32, n, 34)
pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
dtype = {8: np.uint16, 4: np.int32}[code]
data = np.fromfile(name + "_text_document.bin", dtype)
got = [data[p // dtype().itemsize: p // dtype().itemsize + s].tolist() for p, s in zip(pointers, sizes)]
assert got == docs, (name, len(got), len(docs))
print(f"ok: {name}: {len(docs)} sequences, {sum(map(len, docs))} tokens equal the oracle's")
PY
  log=$("$troupe" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
    --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 2 --eval-interval 1000 --log-interval 1 \
    --data-path "${name}_text_document" --tokenizer-type "${type[$name]}" --tokenizer-model "${model[$name]}" \
    --num-threads 1 2>&1) || { echo "$log"; fail "$name: troupe train failed"; }
  vocab=$("$py" -c "import json; print(json.load(open('fx/expected.json'))['$name']['vocab_size'])")
  grep -q "vocabulary $vocab (padded" <<< "$log" || { echo "$log" | head -5; fail "$name: train's vocabulary is not $vocab"; }
  grep -q "finished at iteration 2/2" <<< "$log" || fail "$name: train did not finish"
done

# The tokenizer travels with the weights: `troupe ckpt export --format hf` of each run writes its
# tokenizer's files (tokenizer.model with LlamaTokenizer's tokenizer_config.json; tokenizer.json with
# the configs it was read with), and `troupe train --load` of that folder without tokenizer flags
# takes them (the same vocabulary, the same ids: python3-sentencepiece on the exported model).
for name in gptsp llama2 bloom gpt2; do
  "$troupe" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
    --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 2 --eval-interval 1000 --log-interval 1 \
    --data-path "${name}_text_document" --tokenizer-type "${type[$name]}" --tokenizer-model "${model[$name]}" \
    --num-threads 1 --save "ck_$name" > "save_$name.log" 2>&1 || { cat "save_$name.log"; fail "$name: training to export failed"; }
  "$troupe" ckpt export --load "ck_$name" --format hf --output "hf_$name" > "export_$name.log" 2>&1 ||
    { cat "export_$name.log"; fail "$name: export failed"; }
  "$py" - "$name" "${type[$name]}" "${model[$name]}" "hf_$name" <<'PY' || fail "$name: the exported tokenizer is not the run's"
import filecmp, json, os, sys
name, kind, source, out = sys.argv[1:5]
want = json.load(open("fx/expected.json"))[name]
config = json.load(open(os.path.join(out, "tokenizer_config.json")))
if kind != "HuggingFaceTokenizer":
    import sentencepiece as spm
    assert filecmp.cmp(source, os.path.join(out, "tokenizer.model"), shallow=False), "tokenizer.model differs"
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "tokenizer.model"))
    texts = json.load(open("fx/texts.json"))
    bos = [sp.bos_id()] if kind == "Llama2Tokenizer" else []
    assert [bos + sp.encode(t) for t in texts] == want["ids"], "the exported model encodes differently"
    assert config["tokenizer_class"] == "LlamaTokenizer", config
    assert config["add_bos_token"] == (kind == "Llama2Tokenizer"), config
    assert config["eos_token"] == sp.id_to_piece(sp.eos_id()) and config["bos_token"] == sp.id_to_piece(sp.bos_id()), config
    assert sp.piece_to_id(config["eos_token"]) == want["eod"], (config, want["eod"])
    assert json.load(open(os.path.join(out, "special_tokens_map.json")))["eos_token"] == config["eos_token"]
else:
    folder = source if os.path.isdir(source) else os.path.dirname(source)
    assert filecmp.cmp(os.path.join(folder, "tokenizer.json"), os.path.join(out, "tokenizer.json"), shallow=False)
    assert filecmp.cmp(os.path.join(folder, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"), shallow=False)
assert json.load(open(os.path.join(out, "config.json")))["eos_token_id"] == want["eod"]
print(f"ok: {name}: the export holds the run's tokenizer ({kind})")
PY
  log=$("$troupe" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
    --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 2 --eval-interval 1000 --log-interval 1 \
    --data-path "${name}_text_document" --load "hf_$name" --num-threads 1 2>&1) ||
    { echo "$log"; fail "$name: --load of the exported folder without tokenizer flags failed"; }
  vocab=$("$py" -c "import json; print(json.load(open('fx/expected.json'))['$name']['vocab_size'])")
  grep -q "its tokenizer (.*--tokenizer-type ${type[$name]})" <<< "$log" && grep -q "vocabulary $vocab (padded" <<< "$log" ||
    { echo "$log" | head -12; fail "$name: --load hf_$name did not take the folder's tokenizer"; }
  echo "ok: $name: --load of the exported folder takes its tokenizer (${type[$name]}, vocabulary $vocab)"
done

# Bad input: a corrupt SentencePiece model, a tokenizer.json troupe does not implement, a missing model.
head -c 3000 fx/bpe.model > cut.model
set +e
out=$("$troupe" preprocess --input in.jsonl --output-prefix bad --tokenizer-type Llama2Tokenizer \
  --tokenizer-model cut.model 2>&1); rc=$?
set -e
((rc == 2)) || fail "a cut SentencePiece model: rc $rc, not 2: $out"
grep -q "not a SentencePiece model" <<< "$out" || fail "a cut model's message: $out"
mkdir -p wp
"$py" - <<'PY'
import json
d = json.load(open("fx/llama3/tokenizer.json"))
d["model"]["type"] = "WordPiece"
json.dump(d, open("wp/tokenizer.json", "w"))
json.dump({"eos_token": "<|end_of_text|>"}, open("wp/tokenizer_config.json", "w"))
PY
set +e
out=$("$troupe" train --train-iters 1 --data-path llama3_text_document --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model wp 2>&1); rc=$?
out2=$("$troupe" train --train-iters 1 --data-path llama3_text_document --tokenizer-type GPTSentencePieceTokenizer 2>&1)
rc2=$?
set -e
((rc == 2)) && grep -q "WordPiece" <<< "$out" || fail "a WordPiece tokenizer.json: rc $rc: $out"
((rc2 == 2)) && grep -q -- "--tokenizer-model is required" <<< "$out2" || fail "no --tokenizer-model: rc $rc2: $out2"
[[ ! -e bad_text_document.bin && ! -e bad_text_document.idx ]] || fail "a refused preprocess wrote files"
echo "PASS: SentencePiece (unigram, LLaMA-2-style BPE) and tokenizer.json (LLaMA-3, BLOOM, GPT-2 layouts) datasets hold the oracles' ids; train takes each with its vocabulary; bad models exit 2"
