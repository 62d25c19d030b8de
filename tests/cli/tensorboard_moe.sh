#!/usr/bin/env bash
# An MoE model's load per layer in what a run reports (IterationStats::moe, moe_loss): the progress
# line's "moe loss" after "lm loss" (Megatron-DeepSpeed's), the --metrics-file JSON's moe loss and
# layers, and the TensorBoard tags (Megatron-DeepSpeed's "moe loss"; Megatron-Core's
# load_balancing_loss, z_loss and moe/..._layer_N; troupe's moe/tokens_per_expert_layer_N/expert_E,
# kept tokens and dropped), read back by the independent decoder. The MoE flags of `troupe train`
# are not on this branch, so tests/api/workers/moe_train.cpp runs the model through troupe::train
# and the CLI's own reporting code. Its layers 1 and 3 are MoE layers (4 and 6 experts, top-2,
# capacity factor 1). The counts are the job's: tp 2 x pp 2 x dp 2 in one process and pp 2 x dp 2
# under troupe launch (4 processes, one rank each) report exactly the 1x1x1 run's tokens per expert,
# kept and dropped, and its losses within 1e-5.
source "$(dirname "$0")/common.bash"
decoder=$src_dir/tests/cli/tfevents_decode.py
worker=${TROUPE_MOE_TRAIN_BIN:-$src_dir/build/tests/moe_train}
[[ -x $worker ]] || { echo "SKIP: the moe_train worker is not built ($worker)"; exit 77; }

"$worker" one.jsonl --iters 4 --tensorboard-dir tb > one.log 2>&1 || { cat one.log; fail "the 1x1x1 MoE run failed"; }
"$worker" par.jsonl --iters 4 --tp 2 --pp 2 --dp 2 > par.log 2>&1 || { cat par.log; fail "the tp2 pp2 dp2 MoE run failed"; }
"$troupe" launch --nproc-per-node 4 --master-port "$(free_port)" -- "$worker" "$work/launched.jsonl" --iters 4 \
  --pp 2 --dp 2 > launched.log 2>&1 || { cat launched.log; fail "the MoE run under troupe launch failed"; }

python3 - "$decoder" one.jsonl par.jsonl launched.jsonl one.log tb <<'PY' || fail "the MoE reports are not what the run computed"
import glob, importlib.util, json, re, struct, sys
spec = importlib.util.spec_from_file_location("tfevents_decode", sys.argv[1])
dec = importlib.util.module_from_spec(spec); spec.loader.exec_module(dec)
one, par, launched = ([json.loads(l) for l in open(p)] for p in sys.argv[2:5])
log, tb = open(sys.argv[5]).read(), sys.argv[6]
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
G, S, K = 8, 16, 2  # the worker's global batch, sequence length, top-k
experts = {1: 4, 3: 6}

for runs in (one, par, launched):
    assert [j["iteration"] for j in runs] == [1, 2, 3, 4], runs
for i, j in enumerate(one):
    assert [l["layer"] for l in j["moe"]] == [1, 3], j["moe"]
    want_moe_loss = 0
    for l in j["moe"]:
        assert len(l["routed"]) == len(l["kept"]) == experts[l["layer"]], l
        assert l["micro_batches"] == G // 2, l  # micro-batches of 2 windows
        assert sum(l["routed"]) == G * S * K and sum(l["kept"]) + l["dropped"] == G * S * K, l
        assert all(k <= r for k, r in zip(l["kept"], l["routed"])), l
        want_moe_loss += 0.01 * l["lb_loss"] + 0.001 * l["z_loss"]
    assert abs(j["moe_loss"] - want_moe_loss) <= 1e-12 * want_moe_loss, (j["moe_loss"], want_moe_loss)
    for name, other in (("tp2 pp2 dp2", par), ("pp2 dp2 under launch", launched)):
        o = other[i]
        for a, b in zip(j["moe"], o["moe"]):
            for key in ("layer", "micro_batches", "routed", "kept", "dropped"):
                assert a[key] == b[key], (name, i + 1, key, a[key], b[key])
            for key in ("lb_loss", "z_loss"):
                assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]), (name, i + 1, key, a[key], b[key])
        assert len(o["moe"]) == 2 and abs(o["moe_loss"] - j["moe_loss"]) <= 1e-5 * j["moe_loss"], (name, o)
        assert abs(o["lm_loss"] - j["lm_loss"]) <= 1e-5 * j["lm_loss"], (name, o["lm_loss"], j["lm_loss"])
assert any(l["dropped"] > 0 for j in one for l in j["moe"]), "no token was ever dropped: the test lost its point"

# The progress line: Megatron-DeepSpeed's "moe loss" right after "lm loss", 7 digits.
lines = re.findall(r"iteration +(\d+)/ *4 \|.*?\| lm loss: ([0-9.E+-]+) \| moe loss: ([0-9.E+-]+) \| loss scale", log)
assert [int(i) for i, _, _ in lines] == [1, 2, 3, 4], log
for (i, lm, moe), j in zip(lines, one):
    assert abs(float(lm) - j["lm_loss"]) <= 5e-7 * j["lm_loss"] and abs(float(moe) - j["moe_loss"]) <= 5e-7 * j["moe_loss"]

# TensorBoard: every iteration (--tensorboard-log-interval 1).
(f,) = glob.glob(tb + "/events.out.tfevents.*")
by_tag = {}
for e in dec.events(f)[1:]:
    by_tag.setdefault(e["tag"], []).append((e["step"], e["value"]))
def expect(tag, values, steps=None):
    got = by_tag.pop(tag, None)
    assert got is not None, "no tag %r (tags: %s)" % (tag, sorted(by_tag))
    want = list(zip(steps or [1, 2, 3, 4], values))
    assert got == [(s, f32(v)) for s, v in want], (tag, got, want)
expect("moe loss", [j["moe_loss"] for j in one])
expect("moe loss vs samples", [j["moe_loss"] for j in one], [j["consumed_samples"] for j in one])
expect("moe loss vs tokens", [j["moe_loss"] for j in one], [j["consumed_samples"] * S for j in one])
expect("load_balancing_loss", [sum(l["lb_loss"] for l in j["moe"]) / 2 for j in one])
expect("z_loss", [sum(l["z_loss"] for l in j["moe"]) / 2 for j in one])
for n, layer in enumerate((1, 3)):
    expect("moe/load_balancing_loss_layer_%d" % layer, [j["moe"][n]["lb_loss"] for j in one])
    expect("moe/z_loss_layer_%d" % layer, [j["moe"][n]["z_loss"] for j in one])
    expect("moe/dropped_tokens_layer_%d" % layer, [j["moe"][n]["dropped"] for j in one])
    for e in range(experts[layer]):
        expect("moe/tokens_per_expert_layer_%d/expert_%d" % (layer, e), [j["moe"][n]["routed"][e] for j in one])
        expect("moe/kept_tokens_per_expert_layer_%d/expert_%d" % (layer, e), [j["moe"][n]["kept"][e] for j in one])
left = sorted(t for t in by_tag if "moe" in t or "load_balancing" in t or "z_loss" in t)
assert not left, "unexpected MoE tags: %s" % left
assert "lm loss" in by_tag and "grad-norm" in by_tag, sorted(by_tag)
print("ok: 4 iterations of 2 MoE layers: tp2 pp2 dp2 and pp2 dp2 under launch report the 1x1x1 counts; "
      "the progress line, metrics file and TensorBoard tags hold them")
PY
echo "PASS: an MoE model's load per layer in the progress line, the metrics file and TensorBoard, on every layout"
