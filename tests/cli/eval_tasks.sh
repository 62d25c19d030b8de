#!/usr/bin/env bash
# troupe eval's zero-shot tasks (docs/SERVE.md, "troupe eval --task"), against bench/torch_gpt.py's
# float64 model of the checkpoint's Hugging Face export on small files made here: the windowed
# perplexity (Megatron's --overlapping-eval: windows of 20 tokens, the last 7 of each scored, the
# first window whole) within 1e-6 of the oracle's, for a GPT-2 and a LLaMA; the LAMBADA-style
# last-word accuracy the same texts right and wrong; bad input refused (exit 2).
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import torch, numpy, h5py" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks torch/numpy/h5py"; exit 77; }
make_corpus
head -c 1500 corpus.txt | tr '%' ' ' > text.txt
"$py" - corpus.txt > lambada.jsonl <<'PY'
import json, sys
texts = [t.strip().replace("\n", " ") for t in open(sys.argv[1], encoding="utf-8", errors="replace").read().split("%")]
for t in [t for t in texts if 6 <= len(t.split()) and len(t) < 120][:40]:
    print(json.dumps({"text": t}))
PY
llama=(--normalization RMSNorm --position-embedding-type rope --swiglu --disable-bias-linear
       --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 1 --kv-channels 16
       --ffn-hidden-size 100 --rotary-base 500)
for name in gpt2 llama; do
  [[ $name == llama ]] && flags=("${llama[@]}") || flags=()
  small_train --train-iters 200 --save "ck_$name" --num-threads 1 --hidden-dropout 0 --attention-dropout 0 \
    --seq-length 32 --max-position-embeddings 200 "${flags[@]}" > "train_$name.log" 2>&1 || { cat "train_$name.log"; fail "$name: training failed"; }
  "$troupe" ckpt export --load "ck_$name" --format hf --output "hf_$name" > /dev/null 2>&1 || fail "$name: export failed"
  "$troupe" eval --load "ck_$name" --task perplexity --input text.txt --window 20 --overlapping-eval 7 --json \
    --num-threads 1 > "ppl_$name.json" || fail "$name: perplexity failed"
  # Texts the model gets right too, so that both outcomes occur: each context followed by the word
  # the model itself continues it with greedily.
  "$troupe" generate --load "ck_$name" --prompt "The" --prompt "It was" --prompt "Q: What" --prompt "He said" \
    --top-k 1 --tokens-to-generate 12 --no-stop-on-eod --json --num-threads 1 > "cont_$name.jsonl" || fail "$name: generate failed"
  "$py" - "cont_$name.jsonl" lambada.jsonl > "lambada_$name.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    words = j["text"].split(" ")
    if j["text"].startswith(" ") and len(words) > 2 and words[1]:
        print(json.dumps({"text": j["prompt"] + " " + words[1]}))
print(open(sys.argv[2]).read(), end="")
PY
  "$troupe" eval --load "ck_$name" --task lambada --input "lambada_$name.jsonl" --json --num-threads 1 > "lam_$name.json" ||
    fail "$name: lambada failed"
  "$py" - "$src_dir/bench" "hf_$name" text.txt "lambada_$name.jsonl" "ppl_$name.json" "lam_$name.json" "$name" <<'PY' ||
import json, math, sys
sys.path.insert(0, sys.argv[1])
import torch_gpt
torch_gpt._import_torch()
import torch
model = torch_gpt.HfCausalLM(sys.argv[2], torch.float64)
V = model.real_vocab
def logprobs(ids):
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    return torch.log_softmax(logits[0, :, :V], dim=-1)
# Windows of 20 inputs, the last 7 predictions of each scored (all of the first), as Megatron's
# overlapping evaluation: each token predicted once.
ids = list(open(sys.argv[3], "rb").read())
window, stride, n = 20, 7, len(ids)
loss, scored, start, next_scored = 0.0, 0, 0, 1
while next_scored < n:
    end = min(start + window, n - 1)
    lp = logprobs(ids[start:end])
    for t in range(max(next_scored, start + 1), end + 1):
        loss -= lp[t - 1 - start, ids[t]].item()
        scored += 1
    next_scored = end + 1
    start = max(0, end + stride - window)
got = json.load(open(sys.argv[5]))
assert got["tokens"] == scored == n - 1, (got["tokens"], scored)
want = loss / scored
print(f"{sys.argv[7]}: perplexity loss troupe {got['loss']:.10f} float64 {want:.10f} relative {abs(got['loss'] - want) / want:.1e}")
assert abs(got["loss"] - want) <= 1e-6 * want
# Last words: greedy, teacher-forced, every token of " word" right.
each = []
for line in open(sys.argv[4]):
    text = json.loads(line)["text"].rstrip(" \n")
    ctx, word = text[: text.rfind(" ")], text[text.rfind(" "):]
    c, w = list(ctx.encode()), list(word.encode())
    lp = logprobs(c + w[:-1])
    each.append(all(int(torch.argmax(lp[len(c) - 1 + j]).item()) == w[j] for j in range(len(w))))
lam = json.load(open(sys.argv[6]))
assert lam["each"] == each, (lam["each"], each)
assert any(each) and not all(each), each  # both outcomes occur, so the comparison can fail
print(f"{sys.argv[7]}: last-word accuracy {lam['accuracy']:.3f} ({lam['correct']} of {lam['total']}), text by text the oracle's")
PY
    fail "$name: the tasks differ from the float64 oracle"
done

expect_refusal task "is not a task" "$troupe" eval --load ck_gpt2 --task squad --input text.txt
expect_refusal no_input "needs --input" "$troupe" eval --load ck_gpt2 --task lambada
printf '{"text": "one"}\n' > short.jsonl
expect_refusal one_word "no last word" "$troupe" eval --load ck_gpt2 --task lambada --input short.jsonl
printf 'not json\n' > bad.jsonl
expect_refusal bad_line "line 1" "$troupe" eval --load ck_gpt2 --task lambada --input bad.jsonl
expect_refusal stride "overlapping-eval 30" "$troupe" eval --load ck_gpt2 --task perplexity --input text.txt --window 20 --overlapping-eval 30
echo "PASS: troupe eval's perplexity and last-word tasks equal the float64 oracle's"
