#!/usr/bin/env bash
# `troupe bench gpt` with the mixture-of-experts flags (issue 28) and its PyTorch peer
# (bench/torch_gpt.py train-bench --num-experts): both train a tiny MoE GPT-2, report the same
# parameter count (router with bias, E GELU experts) and the same model FLOPs (k experts and the
# router per token: GptConfig::flops_per_iteration against torch_gpt.py's closed form). Not timed.
source "$(dirname "$0")/common.bash"
py=${PYTHON:-/usr/bin/python3}
"$py" -c 'import numpy' 2>/dev/null || { echo "SKIP: $py cannot import numpy (set PYTHON)"; exit 77; }

sizes=(--num-layers 2 --hidden-size 48 --num-attention-heads 6 --seq-length 16 --micro-batch-size 2
       --vocab-size 200 --iters 1 --warmup-iters 0)
"$troupe" bench gpt "${sizes[@]}" --num-threads 1 --json --num-experts 4 --moe-router-topk 2 \
  --moe-aux-loss-coeff 0.01 > troupe.out 2> troupe.err || { cat troupe.err; fail "the MoE bench failed"; }
torch_out=""
if "$py" -c 'import torch' 2>/dev/null; then
  "$py" "$src_dir/bench/torch_gpt.py" train-bench "${sizes[@]}" --threads 1 --num-experts 4 --topk 2 \
    --moe-aux-loss-coeff 0.01 > torch.out 2> torch.err || { cat torch.err; fail "torch_gpt.py's MoE bench failed"; }
  torch_out=torch.out
fi

"$py" - "$src_dir/bench" troupe.out "$torch_out" <<'PY' || fail "the MoE bench's counts are not the model's"
import json, math, sys
sys.path.insert(0, sys.argv[1])
import torch_gpt

def last_json(path):
    return [json.loads(l) for l in open(path) if l.startswith("{")][-1]

V, C, L, E, F = 200, 48, 2, 4, 4 * 48
layer = 2 * 2 * C + C * 3 * C + 3 * C + C * C + C + E * C + E + E * (C * F + F + F * C + C)
want_params = V * C + 16 * C + L * layer + 2 * C  # wte, wpe, the layers, ln_f
want_flops = torch_gpt.model_flops_per_iter(2, 16, L, C, V, 6, ffn=F, experts=E, topk=2)
t = last_json(sys.argv[2])
assert t["parameters"] == want_params, (t["parameters"], want_params)
assert abs(t["model_flops_per_iter"] - want_flops) <= 1e-12 * want_flops, (t["model_flops_per_iter"], want_flops)
assert "4 experts" in t["moe"], t["moe"]
assert math.isfinite(t["final_loss"]) and t["tokens_per_sec"] > 0, t
if sys.argv[3]:
    p = last_json(sys.argv[3])
    assert p["parameters"] == want_params, (p["parameters"], want_params)
    assert abs(p["model_flops_per_iter"] - want_flops) <= 1e-12 * want_flops, (p["model_flops_per_iter"], want_flops)
    assert math.isfinite(p["final_loss"]), p
PY
echo "PASS: bench_moe"
