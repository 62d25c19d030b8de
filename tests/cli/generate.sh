#!/usr/bin/env bash
# troupe generate (docs/SERVE.md): a GPT-2, a LLaMA (RMSNorm, rope, SwiGLU, grouped-query attention,
# untied head), a BLOOM (ALiBi, embedding LayerNorm) and a Mixtral (the LLaMA with 4 experts, top-2,
# Megatron's router, dropless) trained by troupe generate greedily, for two
# prompts of different lengths batched together, exactly the tokens bench/torch_gpt.py's float64
# models of their Hugging Face exports choose when they recompute the whole sequence at every step,
# with the log-probabilities (prompt and generated) within 1e-6; sampling with a seed repeats itself;
# a checkpoint of a pipeline-parallel run (pp 2 x dp 2) generates the same way, and each Hugging Face
# folder as its checkpoint does; decoding on tensor- and pipeline-parallel shard actors (tp 2, pp 2,
# tp 2 x pp 2; 4 heads, 3 layers: an uneven split) gives the one-decoder tokens, greedy and sampled
# with a seed, in one process and as processes of troupe launch (the Mixtral also with its experts
# whole over the tensor-parallel ranks); --bf16 and --fp16 decode a bf16-trained checkpoint within 16-bit rounding of f32; bad input (a layout the model cannot take among it) is refused with the fix, exit 2.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import torch, numpy, h5py" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks torch/numpy/h5py"; exit 77; }
make_corpus

llama=(--normalization RMSNorm --position-embedding-type rope --swiglu --disable-bias-linear
       --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 1 --kv-channels 16
       --ffn-hidden-size 100 --rotary-base 500 --norm-epsilon 1e-6)
bloom=(--position-embedding-type alibi --embed-layernorm)
prompts=(--prompt "The " --prompt "Q: Why did the chicken")
# 4 heads (2 query groups for the LLaMA) and 3 layers: tp 2 splits them, pp 2 unevenly.
shape=(--num-attention-heads 4 --num-layers 3)

for name in gpt2 llama bloom mixtral gpt2_pp2; do
  # gpt2_pp2: a checkpoint saved by a pipeline of two stages loads whole into the generator.
  case $name in llama) flags=("${llama[@]}" --num-query-groups 2) ;;
    mixtral) flags=("${llama[@]}" --num-query-groups 2 --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.01) ;; bloom) flags=("${bloom[@]}") ;;
    gpt2_pp2) flags=(--pipeline-model-parallel-size 2 --data-parallel-size 2) ;; *) flags=() ;; esac
  small_train --train-iters 20 --save "ck_$name" --num-threads 1 --hidden-dropout 0 --attention-dropout 0 \
    "${shape[@]}" "${flags[@]}" > "train_$name.log" 2>&1 || { cat "train_$name.log"; fail "$name: training failed"; }
  "$troupe" ckpt export --load "ck_$name" --format hf --output "hf_$name" > /dev/null 2>&1 || fail "$name: export failed"
  "$troupe" generate --load "ck_$name" "${prompts[@]}" --top-k 1 --tokens-to-generate 9 --no-stop-on-eod --json \
    --logprobs --num-threads 1 > "gen_$name.jsonl" 2> "gen_$name.err" || { cat "gen_$name.err"; fail "$name: generate failed"; }
  "$py" - "$src_dir/bench" "hf_$name" "gen_$name.jsonl" "$name" <<'PY' || fail "$name: not the float64 oracle's generation"
import json, sys
sys.path.insert(0, sys.argv[1])
import torch_gpt
torch_gpt._import_torch()
import torch
model = torch_gpt.HfCausalLM(sys.argv[2], torch.float64)
rows = [json.loads(l) for l in open(sys.argv[3])]
assert len(rows) == 2, rows
worst = 0.0
for row in rows:
    ids = list(row["prompt"].encode("utf-8"))  # the byte-level tokenizer: a token per byte
    want_prompt = []
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
        lp = torch.log_softmax(logits[0, :, : model.real_vocab], dim=-1)
        want_prompt = [lp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]
        tokens, logprobs = [], []
        seq = list(ids)
        for _ in range(9):  # the whole sequence recomputed at every step: no cache
            logits, _ = model(torch.tensor([seq]))
            lp = torch.log_softmax(logits[0, -1, : model.real_vocab], dim=-1)
            nxt = int(torch.argmax(lp).item())
            tokens.append(nxt)
            logprobs.append(lp[nxt].item())
            seq.append(nxt)
    assert row["tokens"] == tokens, (row["prompt"], row["tokens"], tokens)
    for a, b in zip(row["log_probs"] + row["prompt_log_probs"], logprobs + want_prompt):
        worst = max(worst, abs(a - b))
    assert len(row["prompt_log_probs"]) == len(want_prompt)
print(f"{sys.argv[4]}: greedy tokens equal the float64 oracle's; log-probabilities within {worst:.1e}")
assert worst <= 1e-6, worst
PY
  # The Hugging Face folder itself generates the same tokens (--load HF_FOLDER).
  "$troupe" generate --load "hf_$name" "${prompts[@]}" --top-k 1 --tokens-to-generate 9 --no-stop-on-eod --json \
    --num-threads 1 > "gen_hf_$name.jsonl" 2> "gen_hf_$name.err" || { cat "gen_hf_$name.err"; fail "$name: generate from the folder failed"; }
  "$py" -c 'import json,sys; a=[json.loads(l)["tokens"] for l in open(sys.argv[1])]; b=[json.loads(l)["tokens"] for l in open(sys.argv[2])]; assert a == b, (a, b)' \
    "gen_$name.jsonl" "gen_hf_$name.jsonl" || fail "$name: the folder generates other tokens than its checkpoint"
  # Every decoding layout: the one decoder's tokens, greedy and sampled with a seed.
  sampled=(--top-p 0.95 --temperature 1.3 --seed 7)
  "$troupe" generate --load "ck_$name" "${prompts[@]}" "${sampled[@]}" --tokens-to-generate 9 --no-stop-on-eod --json \
    --num-threads 2 > "sam_$name.jsonl" 2>&1 || fail "$name: sampling failed"
  for layout in "2 1" "1 2" "2 2"; do
    read -r tp pp <<< "$layout"
    at=(--tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp" --num-threads 2)
    "$troupe" generate --load "ck_$name" "${prompts[@]}" --top-k 1 --tokens-to-generate 9 --no-stop-on-eod --json \
      "${at[@]}" > "gen_${name}_$tp$pp.jsonl" 2> "gen_${name}_$tp$pp.err" || { cat "gen_${name}_$tp$pp.err"; fail "$name: tp $tp x pp $pp failed"; }
    "$troupe" generate --load "ck_$name" "${prompts[@]}" "${sampled[@]}" --tokens-to-generate 9 --no-stop-on-eod --json \
      "${at[@]}" > "sam_${name}_$tp$pp.jsonl" 2>&1 || fail "$name: sampling on tp $tp x pp $pp failed"
    for kind in gen sam; do
      "$py" -c 'import json,sys; a=[json.loads(l)["tokens"] for l in open(sys.argv[1])]; b=[json.loads(l)["tokens"] for l in open(sys.argv[2])]; assert a == b and len(a) == 2, (a, b)' \
        "${kind}_$name.jsonl" "${kind}_${name}_$tp$pp.jsonl" || fail "$name: tp $tp x pp $pp ($kind) generates other tokens than one decoder"
    done
  done
  echo "$name: tp 2, pp 2 and tp 2 x pp 2 generate the one decoder's tokens, greedy and sampled"
  if [[ $name == mixtral ]]; then  # the experts whole, two per tensor-parallel rank (EP = tp)
    for pp in 1 2; do
      at=(--tensor-model-parallel-size 2 --expert-model-parallel-size 2 --pipeline-model-parallel-size "$pp" --num-threads 2)
      "$troupe" generate --load "ck_$name" "${prompts[@]}" --top-k 1 --tokens-to-generate 9 --no-stop-on-eod --json \
        "${at[@]}" > "gen_${name}_ep_$pp.jsonl" 2> ep.err || { cat ep.err; fail "$name: ep 2 on tp 2 x pp $pp failed"; }
      "$troupe" generate --load "ck_$name" "${prompts[@]}" "${sampled[@]}" --tokens-to-generate 9 --no-stop-on-eod --json \
        "${at[@]}" > "sam_${name}_ep_$pp.jsonl" 2> ep.err || { cat ep.err; fail "$name: sampling, ep 2 on tp 2 x pp $pp failed"; }
      for kind in gen sam; do
        "$py" -c 'import json,sys; a=[json.loads(l)["tokens"] for l in open(sys.argv[1])]; b=[json.loads(l)["tokens"] for l in open(sys.argv[2])]; assert a == b and len(a) == 2, (a, b)' \
          "${kind}_$name.jsonl" "${kind}_${name}_ep_$pp.jsonl" || fail "$name: ep 2 on tp 2 x pp $pp ($kind) generates other tokens than one decoder"
      done
    done
    expect_refusal ep_not_tp "is not the tensor-parallel size 1" "$troupe" generate --load "ck_$name" --prompt a \
      --expert-model-parallel-size 2
    echo "$name: its 4 experts whole over the tp 2 ranks (tp 2, tp 2 x pp 2) generate the one decoder's tokens"
  fi
  # The same layouts with the ranks as processes of troupe launch (UCX between them; rank 0 generates):
  # the one decoder's tokens again, and the bytes the in-process layout prints.
  [[ $name == gpt2 || $name == mixtral ]] || continue
  for layout in "2 1 2" "1 2 2" "2 2 4"; do
    read -r tp pp n <<< "$layout"
    at=(--tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp" --num-threads 1)
    for kind in gen sam; do
      if [[ $kind == gen ]]; then how=(--top-k 1); else how=("${sampled[@]}"); fi
      timeout 120 "$troupe" launch --nproc-per-node "$n" -- generate --load "ck_$name" "${prompts[@]}" "${how[@]}" \
        --tokens-to-generate 9 --no-stop-on-eod --json "${at[@]}" > "mp_${kind}_${name}_$tp$pp.jsonl" 2> mp.err ||
        { cat mp.err; fail "$name: tp $tp x pp $pp on $n processes ($kind) failed"; }
      cmp -s "${kind}_${name}_$tp$pp.jsonl" "mp_${kind}_${name}_$tp$pp.jsonl" ||
        fail "$name: tp $tp x pp $pp on $n processes ($kind) printed other than in one process"
    done
  done
  echo "$name: tp 2, pp 2 and tp 2 x pp 2 on 2, 2 and 4 processes print what one process prints"
  # Beam search copies sequences' caches: over processes too, the one decoder's hypotheses.
  beam=(--load "ck_$name" --prompt "Q: Why did" --beam-width 3 --tokens-to-generate 6 --json --num-threads 1)
  "$troupe" generate "${beam[@]}" > beam_one.json || fail "$name: beam search failed"
  timeout 120 "$troupe" launch --nproc-per-node 2 -- generate "${beam[@]}" --tensor-model-parallel-size 2 \
    > beam_mp.json 2> mp.err || { cat mp.err; fail "$name: beam search on 2 processes failed"; }
  "$py" -c 'import json,sys; a=json.load(open(sys.argv[1]))["beams"]; b=json.load(open(sys.argv[2]))["beams"]; assert [x["tokens"] for x in a] == [x["tokens"] for x in b] and max(abs(x["score"] - y["score"]) for x, y in zip(a, b)) < 1e-5, (a, b)' \
    beam_one.json beam_mp.json || fail "$name: beam search on 2 processes found other hypotheses"
done
expect_refusal processes "= 4 decode ranks, but troupe launch started 2 processes" \
  "$troupe" launch --nproc-per-node 2 -- generate --load ck_gpt2 --prompt a --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2

# 16-bit decoding (--bf16, --fp16) of a checkpoint trained in bf16, at 1 x 1 and tp 2 x pp 2: the
# prompt's log-probabilities within 16-bit rounding of the f32 decoder's, and not equal to them.
small_train --train-iters 20 --save ck_bf16 --bf16 --num-threads 1 "${shape[@]}" > train_bf16.log 2>&1 ||
  { cat train_bf16.log; fail "bf16 training failed"; }
half=(--load ck_bf16 --prompt "Q: Why did the chicken" --top-k 1 --tokens-to-generate 4 --json --logprobs --num-threads 2)
"$troupe" generate "${half[@]}" > h_f32.json || fail "generate from the bf16 checkpoint failed"
for prec in bf16 fp16; do
  "$troupe" generate "${half[@]}" --$prec > "h_$prec.json" || fail "--$prec failed"
  "$troupe" generate "${half[@]}" --$prec --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    > "h_${prec}_22.json" || fail "--$prec on tp 2 x pp 2 failed"
  "$py" - h_f32.json "h_$prec.json" "h_${prec}_22.json" "$prec" <<'PY' || fail "--$prec: not the 16-bit model's log-probabilities"
import json, sys
f32, half, layout = (json.load(open(p))["prompt_log_probs"] for p in sys.argv[1:4])
tol = 0.05 if sys.argv[4] == "bf16" else 0.01
d = max(abs(a - b) for a, b in zip(f32, half))
assert len(f32) == len(half) == len(layout) and 0 < d < tol, (d, f32, half)
e = max(abs(a - b) for a, b in zip(half, layout))
assert e < tol, (e, half, layout)
print(f"{sys.argv[4]}: the prompt's log-probabilities {d:.1e} from f32 (1 x 1), {e:.1e} between 1 x 1 and tp 2 x pp 2")
PY
done
expect_refusal both_half "--bf16 and --fp16 are both set" "$troupe" generate --load ck_gpt2 --prompt a --bf16 --fp16

# Sampling: the same seed gives the same text, another seed (almost surely) other text.
sample() { "$troupe" generate --load ck_gpt2 --prompt "The " --tokens-to-generate 24 --top-p 0.95 --temperature 1.3 \
  --no-stop-on-eod --json --num-threads 1 "$@"; }
sample --seed 7 > s7a.json && sample --seed 7 > s7b.json && sample --seed 8 > s8.json || fail "sampling failed"
cmp -s s7a.json s7b.json || fail "the same seed gave different text"
! cmp -s s7a.json s8.json || fail "seeds 7 and 8 gave the same 24 tokens"
"$troupe" generate --load ck_gpt2 --prompt "The " --tokens-to-generate 24 --top-k 5 --seed 3 --stop-string " " \
  --json > stop.json || fail "--stop-string failed"
"$py" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert " " not in j["text"] and j["finish_reason"] in ("stop", "stop token", "length"), j' stop.json ||
  fail "--stop-string did not cut the text"

expect_refusal empty "prompt 2 is empty" "$troupe" generate --load ck_gpt2 --prompt "a" --prompt ""
expect_refusal too_long "over the model's 32 positions" "$troupe" generate --load ck_gpt2 --prompt "$(printf 'x%.0s' {1..30})"
expect_refusal top_p "outside (0, 1]" "$troupe" generate --load ck_gpt2 --prompt "a" --top-p 1.5 --top-k 0
expect_refusal both "are both set" "$troupe" generate --load ck_gpt2 --prompt "a" --top-p 0.5 --top-k 3 --tokens-to-generate 4
expect_refusal no_checkpoint "--load nowhere" "$troupe" generate --load nowhere --prompt "a"
expect_refusal layout "does not divide the model's attention heads (4)" "$troupe" generate --load ck_gpt2 --prompt "a" \
  --tensor-model-parallel-size 3
expect_refusal ep_dense "the model has no experts" "$troupe" generate --load ck_gpt2 --prompt "a" \
  --tensor-model-parallel-size 2 --expert-model-parallel-size 2
expect_refusal deep "more than the model's 3 layers" "$troupe" generate --load ck_gpt2 --prompt "a" \
  --pipeline-model-parallel-size 4
printf '{"prompt": "ok"}\n[1, 2]\n' > bad.jsonl
expect_refusal bad_file "bad.jsonl line 2" "$troupe" generate --load ck_gpt2 --prompts-file bad.jsonl
echo "PASS: troupe generate equals the float64 oracle for GPT-2, LLaMA, BLOOM and Mixtral on every decoding layout; sampling repeats with its seed"
