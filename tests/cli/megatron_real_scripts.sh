#!/usr/bin/env bash
# Real users' scripts, second set (issue 27, item 4): shrunk copies under tests/cli/scripts/real/ of
# scripts that troupe now runs with only sizes, paths and the launcher changed, and two it refuses,
# naming the features (each copy's header cites its repository, commit and path):
#  - Megatron-DeepSpeed's examples/sc21 (run_table_1.sh -> CONFIG.sh -> SBATCH.sh -> SRUN.sh):
#    the 2021 --activations-checkpoint-method and --DDP-impl, a static --loss-scale under --fp16;
#  - its universal_checkpointing/megatron_gpt run_bf16.sh, then run_universal_bf16.sh loading that
#    checkpoint on another layout with --universal-checkpoint (the JSON's "data_types" included);
#  - its zero_bubble_pp/zbh1_pretrain_gpt_1.3b.sh: --enable-zbh1-pipeline as troupe's zb-h1 on pp 2;
#  - its MoE/ds_pretrain_gpt_350M_dense.sh: a dense model written with DeepSpeed-MoE's flags at
#    --num-experts 1 and a switched-off "curriculum_learning", on Megatron-DeepSpeed's token schedule;
#  - its compression/125M-Int8-test-64gpu-distilled-group48.sh: refused, its JSON's
#    "compression_training" named (DeepSpeed would quantise the model), nothing written;
#  - Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh: refused with exactly its four
#    problems (FP8, the decoupled learning rate, bf16 gradient reduction, 1p norms in bf16) at once;
#    without those flags the rest of it (NullTokenizer --vocab-size, mock data, --split '99,1,0'
#    with its quotes, --data-cache-path, --no-mmap-bin-files, ...) trains, in bf16 with its
#    --context-parallel-size 2 over two processes (issue 29);
#  - mixture of experts with expert parallelism 2 (troupe launch): Megatron-DeepSpeed's
#    MoE/ds_pretrain_gpt_125M_MoE64.sh (top-1, 4 experts, ep 2 on 2 ranks) and
#    ds_pretrain_gpt_1.3B_PR-MoE64or128.sh (the pyramid "4 8" with the residual MLP, ZeRO 2, ep 2 on
#    2 ranks), and Megatron-LM's mixtral/train_mixtral_8x7b_distributed.sh (pp 2 x dp 2, ep 2, top-2
#    of 4): each trains as written, the DeepSpeed ones in fp16 with the JSON's dynamic loss scaler,
#    Mixtral's in bf16;
#  - long sequences (issue 29): Megatron-DeepSpeed's sequence_parallel/ds_pretrain_gpt_1.3B_seq_parallel_32k.sh
#    (DeepSpeed-Ulysses, --ds-sequence-parallel-size 2 on 2 ranks, fp16) trains as written, and so does
#    the llama3 script's rest above with its --context-parallel-size 2.
source "$(dirname "$0")/common.bash"
real=$src_dir/tests/cli/scripts/real
vocab=$src_dir/fuzz/data/gpt2_tiny/encoder.json merges=$src_dir/fuzz/data/gpt2_tiny/vocab.bpe
head -c 40000 /usr/share/games/fortunes/fortunes 2>/dev/null > corpus.txt || seq 1 3000 > corpus.txt
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix web \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$vocab" --merge-file "$merges" --append-eod > /dev/null
export TROUPE=$troupe DATA_PATH=$PWD/web_text_document VOCAB=$vocab MERGES=$merges

# losses LOG N: the log's N iterations each have a finite lm loss; prints them.
losses() {
  python3 - "$1" "$2" <<'PY'
import math, re, sys
text = open(sys.argv[1]).read()
its = [int(x) for x in re.findall(r"^ iteration +(\d+)/", text, re.M)]
got = [float(x) for x in re.findall(r"\| lm loss: ([0-9.eE+-]+) \|", text)]
assert len(got) == int(sys.argv[2]) == len(its) and all(map(math.isfinite, got)), (its, got)
print(" ".join(f"{x:.4f}" for x in got))
PY
}
has_notes() {  # LOG NOTE...: each note is in the log
  local log=$1
  shift
  for note in "$@"; do grep -qF -- "note: $note" "$log" || { cat "$log"; fail "$log: no start-up note '$note'"; }; done
}

# --- sc21: the sbatch chain as written, one rank -------------------------------------------------
mkdir sc21 && cp "$real"/sc21/*.sh sc21/ && (cd sc21 && bash run_table_1.sh) || fail "sc21's run_table_1.sh failed"
log=$(ls sc21/logs/results_table_1_model_size_1.7B_*.log)
grep -q "finished at iteration 3/3" "$log" || { cat "$log"; fail "sc21: the run did not finish"; }
has_notes "$log" "--activations-checkpoint-method uniform: no effect" "--DDP-impl torch: no effect"
(( $(grep -c "loss scale: 8192.0 |" "$log") == 3 )) || { cat "$log"; fail "sc21: --loss-scale 8192 is not the static scale"; }
echo "ok: sc21's run_table_1.sh trains (losses $(losses "$log" 3))"

# --- universal checkpointing: save on tp 2 x dp 2, load on pp 2 ----------------------------------
mkdir uc && cp "$real"/universal_checkpointing/*.sh uc/
(cd uc && MASTER_PORT=$(free_port) bash run_bf16.sh > save.log 2>&1) || { tail -30 uc/save.log; fail "run_bf16.sh failed"; }
grep -q "saved checkpoint at iteration 2 to z1_uni_ckpt/checkpoints/gpt2/z1/bf16/tp2_pp1_dp2_sp1_toy" uc/save.log ||
  { cat uc/save.log; fail "run_bf16.sh did not save at its exit interval"; }
has_notes uc/save.log '"data_types.grad_accum_dtype" in' \
  "--loss-scale with the DeepSpeed file's bf16: no effect"
(cd uc && MASTER_PORT=$(free_port) bash run_universal_bf16.sh > load.log 2>&1) ||
  { tail -30 uc/load.log; fail "run_universal_bf16.sh failed"; }
for want in "resuming with changes: tensor-parallel size 2 -> 1, pipeline-parallel size 1 -> 2, global batch size 8 -> 4" \
            "loaded z1_uni_ckpt/checkpoints/gpt2/z1/bf16/tp2_pp1_dp2_sp1_toy/iter_0000002 (saved by tp 2, pp 1, ZeRO 1): iteration 2, 16 samples consumed" \
            "finished at iteration 4/4"; do
  grep -qF -- "$want" uc/load.log || { cat uc/load.log; fail "run_universal_bf16.sh: no line '$want'"; }
done
has_notes uc/load.log "--universal-checkpoint: no effect"
python3 - uc/save.log uc/load.log <<'PY' || fail "the universal run did not continue from the saved iteration"
import re, sys
its = lambda p: [int(x) for x in re.findall(r"^ iteration +(\d+)/", open(p).read(), re.M)]
assert its(sys.argv[1]) == [1, 2] and its(sys.argv[2]) == [3, 4], (its(sys.argv[1]), its(sys.argv[2]))
PY
echo "ok: universal_checkpointing's run_bf16.sh saves on tp 2 x dp 2, run_universal_bf16.sh continues it on pp 2"

# --- zero bubble: --enable-zbh1-pipeline on pp 2 -------------------------------------------------
mkdir zb && cp "$real"/zero_bubble_pp/*.sh zb/
(cd zb && TEMPLATE_DIR=$src_dir/tests/cli/scripts bash zbh1_pretrain_gpt_1.3b.sh > /dev/null 2>&1) ||
  { tail -30 zb/log_zbh1_exact.txt; fail "zbh1_pretrain_gpt_1.3b.sh failed"; }
log=zb/log_zbh1_exact.txt
grep -q "ZeRO stage 0, schedule zb-h1," "$log" || { cat "$log"; fail "zbh1: the schedule is not zb-h1"; }
has_notes "$log" "--enable-zbh1-pipeline: read as --pipeline-schedule zb-h1" "--enable-zbh1-exact-semantics: no effect"
echo "ok: zero_bubble_pp's zbh1_pretrain_gpt_1.3b.sh trains with zb-h1 on pp 2 (losses $(losses "$log" 3))"

# --- a dense model with DeepSpeed-MoE's flags at --num-experts 1 ---------------------------------
mkdir moe && cp "$real"/moe_dense/* moe/
(cd moe && bash ds_pretrain_gpt_350M_dense.sh > /dev/null) || fail "ds_pretrain_gpt_350M_dense.sh failed"
log=$(ls moe/output/log/*.log)
has_notes "$log" "--num-experts 1: no effect" "--moe-expert-parallel-size 1: no effect" "--moe-loss-coeff 0.01: no effect" \
  "--moe-min-capacity 4: no effect" '"curriculum_learning" in'
python3 - "$log" <<'PY' || fail "the dense MoE-flag script's learning rates are not Megatron-DeepSpeed's token schedule"
import math, re, sys
rows = re.findall(r"^ iteration +(\d+)/.*\| learning rate: ([0-9.E+-]+) \|.*number of skipped iterations: +(\d+)",
                  open(sys.argv[1]).read(), re.M)
assert len(rows) == 3, rows                          # --train-tokens 384 at 4 x 32 tokens an iteration
lr, min_lr, Wt, Dt, tok = 3.0e-4, 3.0e-5, 128, 384, 128
t = 0
for it, got, skipped in rows:
    want = lr * t / Wt if t <= Wt else min_lr + 0.5 * (math.cos(math.pi * (t - Wt) / (Dt - Wt)) + 1) * (lr - min_lr)
    assert abs(float(got) - want) <= 1e-6 * lr, (it, got, want)
    t += tok if int(skipped) == 0 else 0
PY
echo "ok: MoE's ds_pretrain_gpt_350M_dense.sh trains the dense model (losses $(losses "$log" 3))"

# --- refused: DeepSpeed compression --------------------------------------------------------------
mkdir cmp && cp "$real"/compression/* cmp/
(cd cmp && bash 125M-Int8-test-64gpu-distilled-group48.sh > /dev/null) || fail "the compression script itself failed"
log=$(ls cmp/log/*.log)
python3 - "$log" <<'PY' || { cat "$log"; fail "the compression script: not exactly compression_training's refusal"; }
import re, sys
text = open(sys.argv[1]).read()
errors = re.findall(r"^troupe train: error: (.*)$", text, re.M)
assert len(errors) == 1 and "problems with" not in errors[0], errors
e = errors[0]
assert '"compression_training" is present' in e and "weight_quantization" in e and "activation_quantization" in e, e
assert " iteration " not in text, "it trained"
PY
[[ -z $(find cmp/checkpoint -type f) ]] || fail "the refused compression run wrote a checkpoint"  # (the script makes the folder)
echo "ok: compression's 125M-Int8 script is refused naming DeepSpeed's compression and its quantisation"

# --- refused: Megatron-LM's llama3 FP8 script, then the rest of it -------------------------------
mkdir llama && cp "$real"/llama3/*.sh llama/
(cd llama && MASTER_PORT=$(free_port) bash train_llama3_8b_h100_fp8.sh ck tb > refused.log 2>&1) || true
python3 - llama/refused.log <<'PY' || { cat llama/refused.log; fail "the llama3 FP8 script: not exactly its four problems"; }
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"error: (\d+) problems with the flags:", text)
assert m and m.group(1) == "4", m
items = re.findall(r"^  - (.*)$", text, re.M)
starts = sorted({i.split(":")[0] for i in items})  # both ranks of the cp 2 launch say it
assert starts == ["--apply-layernorm-1p with a 16-bit run", "--decoupled-lr 5.0e-4, --decoupled-min-lr 4.5e-5",
                  "--fp8-format hybrid, --fp8-amax-history-len 1024, --fp8-amax-compute-algo max, --fp8-param-gather",
                  "--grad-reduce-in-bf16"], starts
assert any("FP8" in i and "not in troupe" in i for i in items), items
assert " iteration " not in text, "it trained"
PY
[[ ! -e llama/ck ]] || [[ -z $(find llama/ck -type f) ]] || fail "the refused llama3 run wrote a checkpoint"
cat > drop_refused.sh <<'SH'
#!/usr/bin/env bash
# troupe, minus the flags it refuses in the llama3 FP8 script (and their values)
args=() skip=0
for a in "$@"; do
  if (( skip )); then skip=0; continue; fi
  case $a in
    --decoupled-lr | --decoupled-min-lr | --fp8-format | --fp8-amax-history-len | --fp8-amax-compute-algo) skip=1 ;;
    --grad-reduce-in-bf16 | --fp8-param-gather | --apply-layernorm-1p) ;;
    *) args+=("$a") ;;
  esac
done
exec "$REAL_TROUPE" "${args[@]}"
SH
chmod +x drop_refused.sh
(cd llama && REAL_TROUPE=$troupe TROUPE=$PWD/../drop_refused.sh MASTER_PORT=$(free_port) \
  bash train_llama3_8b_h100_fp8.sh ck tb > rest.log 2>&1) || { tail -30 llama/rest.log; fail "the rest of the llama3 script failed"; }
grep -q "finished at iteration 3/3" llama/rest.log || { cat llama/rest.log; fail "the rest of the llama3 script did not train"; }
for want in "LLaMA 2 layers, hidden 64, 4 heads, seq 32, vocabulary 512 (padded to 512)" \
            "data: mock data: uniform random tokens over a vocabulary of 512" \
            "cp 2 (16 tokens of each sequence per rank, p2p ring)"; do
  grep -qF -- "$want" llama/rest.log || { cat llama/rest.log; fail "the rest of the llama3 script: no line '$want'"; }
done
has_notes llama/rest.log "--calculate-per-token-loss: no effect" \
  "--data-cache-path" "--no-mmap-bin-files: no effect" "--cross-entropy-loss-fusion: no effect" "--ckpt-format torch_dist: no effect"
echo "ok: the llama3 FP8 script is refused with its four problems; the rest of it trains (losses $(losses llama/rest.log 3))"

# --- mixture of experts, ep 2, as written (fp16 with DeepSpeed's loss scaler, bf16) ------------------
for script in ds_pretrain_gpt_125M_MoE64.sh ds_pretrain_gpt_1.3B_PR-MoE64or128.sh; do
  d=moe-${script%.sh}
  mkdir "$d" && cp "$real"/moe/* "$d"/
  (cd "$d" && bash "$script" > /dev/null) || fail "$script itself failed"
  log=$(ls "$d"/output/log/*.log)
  grep -q "finished at iteration 3/9" "$log" || { cat "$log"; fail "$script: the run did not finish"; }
  grep -q "note: --num-experts .*: read as Megatron-DeepSpeed's mixture of experts" "$log" ||
    { cat "$log"; fail "$script: no reading of the MoE flags"; }
  grep -qF "expert-parallel size 2," "$log" || { cat "$log"; fail "$script: not expert-parallel size 2"; }
  grep -qiE "fp16|float16" "$log" || { cat "$log"; fail "$script: not trained in fp16"; }
  has_notes "$log" "--create-moe-param-group: no effect"
  [[ -n $(find "$d"/output/checkpoint -type f) ]] || fail "$script: no checkpoint written"
done
log=$(ls moe-ds_pretrain_gpt_125M_MoE64/output/log/*.log)
grep -qF "4 experts in every 2nd layer (layers 2 of 2); DeepSpeed-MoE's top-1 gating" "$log" ||
  { cat "$log"; fail "125M_MoE64: not 4 top-1 experts every 2nd layer"; }
echo "ok: MoE's ds_pretrain_gpt_125M_MoE64.sh trains as written (fp16) with ep 2 on dp 2 (losses $(losses "$log" 3))"
log=$(ls moe-ds_pretrain_gpt_1.3B_PR-MoE64or128/output/log/*.log)
for want in "experts 4, 8 (one count per MoE layer) in every 2nd layer (layers 2, 4 of 4)" \
            "residual MLP beside the experts (PR-MoE)" "ZeRO stage 2, schedule"; do
  grep -qF -- "$want" "$log" || { cat "$log"; fail "PR-MoE64or128: no '$want'"; }
done
echo "ok: MoE's ds_pretrain_gpt_1.3B_PR-MoE64or128.sh trains as written (fp16): the pyramid with ep 2 on dp 2, ZeRO 2 (losses $(losses "$log" 3))"

# --- long sequences: Megatron-DeepSpeed's DeepSpeed-Ulysses script, as written (fp16, sp 2) ------------
mkdir ulysses && cp "$real"/seq_parallel/* ulysses/
(cd ulysses && bash ds_pretrain_gpt_1.3B_seq_parallel_32k.sh > run.log 2>&1) ||
  { tail -30 ulysses/run.log; fail "ds_pretrain_gpt_1.3B_seq_parallel_32k.sh failed"; }
for want in "finished at iteration 3/" "fp16 weights and activations" \
            "Ulysses 2 (32 tokens of each sequence per rank, attention by heads after an all-to-all)"; do
  grep -qF -- "$want" ulysses/run.log || { cat ulysses/run.log; fail "the Ulysses script: no '$want'"; }
done
has_notes ulysses/run.log "--use-flash-attn-v2: no effect" "--checkpoint-activations: read as --recompute-granularity full"
echo "ok: sequence_parallel's ds_pretrain_gpt_1.3B_seq_parallel_32k.sh trains as written (fp16) with Ulysses 2 on 2 ranks (loss at iteration 3: $(losses ulysses/run.log 1))"

sp=$src_dir/fuzz/corpus/sentencepiece_model/bpe_byte_fallback.model
"$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix sp \
  --tokenizer-type Llama2Tokenizer --tokenizer-model "$sp" --append-eod > /dev/null
mkdir mixtral && cp "$real"/mixtral/*.sh mixtral/
(cd mixtral && MASTER_PORT=$(free_port) bash train_mixtral_8x7b_distributed.sh ck "$sp" ../sp_text_document > rest.log 2>&1) ||
  { tail -30 mixtral/rest.log; fail "the Mixtral script failed"; }
log=mixtral/rest.log
for want in "finished at iteration 3/3" "layout tp 1, pp 2, dp 2" \
            "note: --num-experts 4: read as Megatron-LM's mixture of experts (its own flag --moe-router-topk): 4 experts in every layer; Megatron-Core's top-2 router" \
            "load balancing aux_loss x 0.01; expert width 128; expert-parallel size 2,"; do
  grep -qF -- "$want" "$log" || { cat "$log"; fail "the Mixtral script: no '$want'"; }
done
has_notes "$log" "--moe-grouped-gemm: no effect" "--moe-token-dispatcher-type alltoall: no effect" \
  "--use-distributed-optimizer: read as --zero-stage 1"
grep -qiE "bf16|bfloat16" "$log" || { cat "$log"; fail "the Mixtral script: not trained in bf16"; }
echo "ok: Mixtral's train_mixtral_8x7b_distributed.sh trains as written (bf16) on pp 2 x dp 2 with ep 2 (losses $(losses "$log" 3))"
echo "PASS: sc21, universal checkpointing, zero bubble, a dense MoE-flag script and three MoE scripts (as written: fp16, bf16, ep 2) train; compression and FP8 are refused by name"
