#!/usr/bin/env bash
# troupe plan end to end (docs/PLAN.md): GPT-3 175B on 128 DGX A100 nodes as JSON (the best layouts
# in order, each dividing the 1024 GPUs, with every key the issue names), the text table, fixed sizes
# kept fixed, Megatron's own flags (the sc21 Table 1 script's, 1T parameters on 3072 GPUs), the memory
# per rank equal to `troupe train --dry-run`'s plan, and bad input (an unknown preset, a model too
# large for the cluster, a cluster file with several problems, no global batch) refused with the fix,
# exit 2.
source "$(dirname "$0")/common.bash"

gpt3=(--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048
      --global-batch-size 1536 --tokenizer-type NullTokenizer --vocab-size 51200 --bf16)

"$troupe" plan "${gpt3[@]}" --gpu A100-80GB --nodes 128 --gpus-per-node 8 --json --top 8 > gpt3.json 2> gpt3.err \
  || { cat gpt3.err; fail "plan of GPT-3 175B failed"; }
python3 - gpt3.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
layouts = j["layouts"]
assert len(layouts) == 8, len(layouts)
keys = ["tp", "pp", "vpp", "dp", "cp", "ep", "zero_stage", "micro_batch_size", "recompute", "offload", "fits",
        "memory_per_rank_bytes", "bubble_fraction", "iteration_seconds", "tokens_per_second", "model_tflops_per_gpu",
        "hardware_tflops_per_gpu", "mfu"]
for l in layouts:
    missing = [k for k in keys if k not in l]
    assert not missing, missing
    assert l["tp"] * l["pp"] * l["dp"] * l["cp"] == 1024, l
    assert l["fits"] and 0 < l["memory_per_rank_bytes"] <= 80 * 2**30, l
    assert 0 < l["mfu"] < 1 and l["hardware_tflops_per_gpu"] >= l["model_tflops_per_gpu"] > 0, l
    assert abs(l["tokens_per_second"] * l["iteration_seconds"] - 1536 * 2048) < 1e-6 * 1536 * 2048, l
    assert 0 <= l["bubble_fraction"] < 1, l
its = [l["iteration_seconds"] for l in layouts]
assert its == sorted(its), its
s = j["searched"]
assert s["layouts"] > 1000 and s["out_of_memory"] > 0 and s["simulated"] >= 8, s
best = layouts[0]
print(f"GPT-3 175B on 1024 A100: {s['layouts']} layouts in {s['seconds']:.2f} s; best tp {best['tp']} pp {best['pp']} "
      f"vpp {best['vpp']} dp {best['dp']} mbs {best['micro_batch_size']} ZeRO-{best['zero_stage']} "
      f"recompute {best['recompute']}: {best['iteration_seconds']:.2f} s/iteration, "
      f"{best['model_tflops_per_gpu']:.0f} TFLOP/s model, MFU {100 * best['mfu']:.0f}%")
PY

"$troupe" plan "${gpt3[@]}" --gpu A100-80GB --nodes 128 --gpus-per-node 8 > gpt3.txt
grep -q "the best in detail" gpt3.txt || { cat gpt3.txt; fail "the text plan has no detail of the best layout"; }
grep -q "rejected for memory" gpt3.txt || { cat gpt3.txt; fail "the text plan names no layout rejected for memory"; }

# Fixed sizes stay fixed.
"$troupe" plan "${gpt3[@]}" --gpu A100-80GB --nodes 128 --gpus-per-node 8 --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 16 --recompute-granularity full --json > fixed.json
python3 - fixed.json <<'PY'
import json, sys
for l in json.load(open(sys.argv[1]))["layouts"]:
    assert (l["tp"], l["pp"], l["dp"], l["recompute"]) == (8, 16, 8, "full"), l
PY

# Megatron's own flags: the sc21 scripts' (examples/academic_paper_scripts/sc21/CONFIG.sh with
# run_table_1.sh's 1T row), the data and tokenizer files aside, on the 384 nodes the script asks for.
"$troupe" plan --tensor-model-parallel-size 8 --pipeline-model-parallel-size 64 --micro-batch-size 1 \
  --global-batch-size 3072 --num-layers 128 --hidden-size 25600 --num-attention-heads 160 --DDP-impl local \
  --tokenizer-type NullTokenizer --vocab-size 51200 --log-interval 5 --seq-length 2048 --max-position-embeddings 2048 \
  --train-iters 500 --lr-decay-iters 320 --lr 0.0001 --min-lr 0.00001 --lr-decay-style cosine \
  --lr-warmup-fraction 0.01 --split 969,30,1 --eval-iters 100 --eval-interval 1000 --clip-grad 1.0 --fp16 \
  --loss-scale 8192 --recompute-granularity full --recompute-method uniform \
  --gpu A100-80GB --nodes 384 --gpus-per-node 8 --profile megatron --json > sc21.json 2> sc21.err \
  || { cat sc21.err; fail "plan of the sc21 1T script failed"; }
python3 - sc21.json <<'PY'
import json, sys
l = json.load(open(sys.argv[1]))["layouts"][0]
assert (l["tp"], l["pp"], l["dp"], l["micro_batch_size"]) == (8, 64, 6, 1), l
print(f"sc21 1T row: predicted {l['hardware_tflops_per_gpu']:.0f} TFLOP/s per GPU with recompute "
      f"(published 163), bubble {100 * l['bubble_fraction']:.1f}%")
PY

# The memory per rank is the --dry-run plan's (the CPU, one thread per rank as in one process).
small=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --micro-batch-size 2
       --global-batch-size 8 --tokenizer-type NullTokenizer --vocab-size 500 --tensor-model-parallel-size 2
       --pipeline-model-parallel-size 2 --data-parallel-size 2 --zero-stage 1 --num-threads 1
       --recompute-granularity none --pipeline-schedule 1f1b --offload-optimizer none)
"$troupe" train "${small[@]}" --mock-data --train-iters 1 --dry-run > dry.txt
"$troupe" plan "${small[@]}" --gpu cpu --gpus-per-node 8 --json > small.json
python3 - dry.txt small.json <<'PY'
import json, re, sys
stages = []
for line in open(sys.argv[1]):
    m = re.search(r"stage \d+: \d+ parameters, ([\d.]+) MiB of weights.*?; ([\d.]+) MiB of activations", line)
    if m:
        stages.append(float(m.group(1)) + float(m.group(2)))
assert stages, "no stage lines in the dry run"
layouts = [l for l in json.load(open(sys.argv[2]))["layouts"] if not l["sequence_parallel"]]
assert layouts, "no layout without sequence parallelism"
plan = layouts[0]["memory_per_rank_bytes"] / 2**20
assert abs(plan - max(stages)) <= 0.01 * max(stages), (plan, stages)
print(f"memory per rank: plan {plan:.3f} MiB, --dry-run {max(stages):.3f} MiB")
PY

# troupe train --auto-layout: the layout plan predicts fastest here, printed with the runner-up, trains;
# a size given stays fixed; the dry run's memory plan is the one of the chosen layout.
tiny=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --global-batch-size 8 --mock-data
      --tokenizer-type NullTokenizer --vocab-size 300 --log-interval 1 --train-iters 2)
"$troupe" train "${tiny[@]}" --auto-layout > auto.log 2>&1 || { cat auto.log; fail "--auto-layout training failed"; }
grep -q "auto-layout (troupe plan's model of this host" auto.log || { cat auto.log; fail "no auto-layout line"; }
grep -q "runner-up: " auto.log || { cat auto.log; fail "no runner-up line"; }
grep -q "finished at iteration 2/2" auto.log || { cat auto.log; fail "--auto-layout did not train"; }
"$troupe" train "${tiny[@]}" --auto-layout --tensor-model-parallel-size 2 > auto_tp.log 2>&1 \
  || { cat auto_tp.log; fail "--auto-layout with tp 2 failed"; }
grep -q "auto-layout .*: tp 2, " auto_tp.log || { cat auto_tp.log; fail "the fixed tp 2 was not kept"; }
grep -q "layout tp 2, " auto_tp.log || { cat auto_tp.log; fail "the job did not run at tp 2"; }

# Under troupe launch the launcher plans once for its processes and every process runs that layout.
"$troupe" launch --nproc-per-node 2 -- train "${tiny[@]}" --auto-layout --num-threads 1 > auto_launch.log 2>&1 \
  || { cat auto_launch.log; fail "--auto-layout under troupe launch failed"; }
grep -q "troupe launch: auto-layout (troupe plan's model of this host" auto_launch.log \
  || { cat auto_launch.log; fail "the launcher printed no auto-layout line"; }
grep -q "finished at iteration 2/2" auto_launch.log || { cat auto_launch.log; fail "the launched job did not train"; }

# Bad input: exit 2 with the fix.
expect_refusal preset "A100-40GB, A100-80GB, H100-80GB, H200, cpu" "$troupe" plan "${gpt3[@]}" --gpu A100
expect_refusal too_big "it fits on" "$troupe" plan "${gpt3[@]}" --gpu A100-80GB --nodes 1 --gpus-per-node 8
# A mixture-of-experts model (Mixtral-like routing, 8 experts, top-2) with its expert-parallel size
# fixed and the data-parallel size searched: every layout keeps ep 4, on a dp it divides.
"$troupe" plan --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
  --max-position-embeddings 2048 --global-batch-size 256 --tokenizer-type NullTokenizer --vocab-size 51200 --bf16 --num-experts 8 \
  --moe-router-topk 2 --expert-model-parallel-size 4 --gpu A100-80GB --nodes 4 --gpus-per-node 8 --json --top 5 \
  > moe.json 2> moe.err || { cat moe.err; fail "plan of an MoE model with ep 4 failed"; }
python3 - moe.json <<'PY'
import json, sys
layouts = json.load(open(sys.argv[1]))["layouts"]
assert layouts, "no layout"
for l in layouts:
    assert l["ep"] == 4 and l["dp"] % 4 == 0, l
print(f"MoE with ep 4: best tp {layouts[0]['tp']} pp {layouts[0]['pp']} dp {layouts[0]['dp']}, "
      f"{layouts[0]['iteration_seconds']:.2f} s/iteration")
PY

printf '{"gpu": "H100-80GB", "nodes": 0, "nvlnk_gbps": 300, "memory_gib": "80"}' > bad_cluster.json
expect_refusal cluster_file "3 problems" "$troupe" plan "${gpt3[@]}" --cluster bad_cluster.json
grep -q 'did you mean "nvlink_gbps"' cluster_file.err || { cat cluster_file.err; fail "no spelling hint"; }
expect_refusal zero_nodes "--nodes is 0 -- give at least 1" "$troupe" plan "${gpt3[@]}" --gpu H100-80GB --nodes 0
# An unknown flag beside a bad head count: both named at once, as plan's, and nothing a plan does not
# read (no data path, no run length) asked for.
expect_refusal unknown_flag "--bogus-flag: not a flag of troupe plan" "$troupe" plan --num-layers 2 --hidden-size 64 \
  --num-attention-heads 5 --tokenizer-type NullTokenizer --vocab-size 100 --global-batch-size 8 --gpu H200 --bogus-flag
grep -q -- "--num-attention-heads 5 does not divide" unknown_flag.err || { cat unknown_flag.err; fail "the head count is not named"; }
! grep -q -- "--data-path\|--train-iters\|troupe train" unknown_flag.err || { cat unknown_flag.err; fail "train's problems in plan's message"; }
expect_refusal no_batch "--global-batch-size is not given" "$troupe" plan --num-layers 2 --hidden-size 64 \
  --num-attention-heads 4 --tokenizer-type NullTokenizer --vocab-size 100 --gpu H200
echo "PASS"
