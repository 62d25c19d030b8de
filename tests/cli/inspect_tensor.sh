#!/usr/bin/env bash
# troupe inspect's tensor and dump (docs/INSPECT.md) on a tp 2 x pp 2 job with ZeRO-1, in one
# process and under troupe launch: while paused after iteration k, a parameter's and its Adam
# moment's statistics equal those numpy computes from the dumped HDF5 file, and the dumped values
# equal the checkpoint `save` wrote after the same iteration (assembled from every rank's shard);
# --rank R shows that rank's part; a gradient from the next step is finite and dumps with the same
# statistics; an unknown name is refused with rc 2.
source "$(dirname "$0")/common.bash"
py=/usr/bin/python3
"$py" -c "import h5py, numpy" 2> /dev/null || { echo "SKIP: /usr/bin/python3 lacks h5py/numpy"; exit 77; }
train_args=(train --num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
            --global-batch-size 6 --mock-data --tokenizer-type ByteLevelTokenizer --log-interval 1000 --train-iters 100000
            --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --zero-stage 1)

check() {  # check NAME LAUNCH...: one job, every check
  local name=$1
  shift
  local insp=$name.json
  "$troupe" "$@" "${train_args[@]}" --inspect 0 --inspect-file "$work/$insp" --save "$name" > "$name.log" 2>&1 &
  job=$!
  kill_on_exit $job "$work/$insp"
  wait_for_file "$insp"
  ask() { "$troupe" inspect "$insp" --exec "$*" --json; }
  ask pause > pause.json || { cat pause.json "$name.log"; fail "$name: pause"; }
  local at
  at=$("$py" -c "import json; print(json.load(open('pause.json'))['paused_after'])")
  ask save > save.json || fail "$name: save"
  local w=transformer.h.1.attn.c_attn.weight  # on pipeline stage 1, split over tp
  ask tensor $w --bins 7 > value.json || { cat value.json; fail "$name: tensor $w"; }
  ask tensor $w.exp_avg > exp_avg.json || fail "$name: tensor $w.exp_avg"
  ask tensor $w --rank 3 > rank3.json || fail "$name: tensor --rank 3"
  ask dump $w value.h5 > dump.json || { cat dump.json; fail "$name: dump"; }
  ask dump $w.exp_avg exp_avg.h5 > /dev/null || fail "$name: dump exp_avg"
  ask dump transformer.wte.weight wte.h5 > /dev/null || fail "$name: dump wte"
  set +e
  ask tensor transformer.h.1.attn.c_atn.weight > unknown.json
  local rc_unknown=$?
  ask tensor $w.grad > grad_paused.json
  local rc_paused=$?
  set -e
  (( rc_unknown == 2 )) && grep -q "no parameter" unknown.json || { cat unknown.json; fail "$name: unknown name rc $rc_unknown"; }
  (( rc_paused == 2 )) && grep -q "paused" grad_paused.json || { cat grad_paused.json; fail "$name: grad while paused"; }
  ask resume > /dev/null
  ask dump $w.grad grad.h5 > grad.json || { cat grad.json; fail "$name: dump $w.grad"; }
  # An op's result in the next step, on the rank that computes it (its tensor-parallel part).
  ask tensor layer1:mlp_fc1 --rank 2 --micro-batch 1 > act.json || { cat act.json; fail "$name: tensor layer1:mlp_fc1"; }
  ask dump layer1:ln2:backward act.h5 --rank 3 > actdump.json || { cat actdump.json; fail "$name: dump layer1:ln2:backward"; }
  set +e
  ask tensor layer1:mlp_fc1 > act_norank.json
  local rc_norank=$?
  ask tensor layer0:mlp_fc1 --rank 2 > act_elsewhere.json
  local rc_elsewhere=$?
  ask tensor layer1:mlp_frob --rank 2 > act_unknown.json
  local rc_frob=$?
  set -e
  (( rc_norank == 2 )) && grep -q "rank R" act_norank.json || { cat act_norank.json; fail "$name: an op without --rank"; }
  (( rc_elsewhere == 2 )) && grep -q "did not compute it" act_elsewhere.json ||
    { cat act_elsewhere.json; fail "$name: layer 0 on rank 2 (stage 1)"; }
  (( rc_frob == 2 )) && grep -q "mlp_fc1" act_unknown.json || { cat act_unknown.json; fail "$name: an unknown op"; }
  local dir
  dir=$(printf '%s/iter_%07d' "$name" "$at")
  wait_for_checkpoint "$dir"
  kill -INT $job
  wait $job || true
  kill_on_exit
  "$py" - "$dir" "$w" "$at" <<'PY' || fail "$name: the tensor statistics or values are wrong"
import glob, json, sys, h5py, numpy as np
ckdir, w, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
def stats_match(j, x, what):
    x = x.astype(np.float64).ravel()
    f = x[np.isfinite(x)]
    assert j["elements"] == x.size and j["nan"] == int(np.isnan(x).sum()) and j["inf"] == int(np.isinf(x).sum()), what
    for key, v in (("min", f.min()), ("max", f.max()), ("mean", f.mean()), ("std", f.std()), ("norm", np.sqrt((f * f).sum()))):
        assert abs(j[key] - v) <= 1e-9 * max(1.0, abs(v)) + 1e-15, (what, key, j[key], v)
    counts, _ = np.histogram(f, bins=len(j["histogram"]["counts"]), range=(f.min(), f.max()))
    assert sum(j["histogram"]["counts"]) == f.size, what
    # numpy puts a value on a bin edge in the upper bin as troupe does; rounding may move one value.
    assert np.abs(np.array(j["histogram"]["counts"]) - counts).sum() <= 2, (what, j["histogram"]["counts"], counts)
def assemble(group, name):
    out = None
    for path in sorted(glob.glob(ckdir + "/shard_*.h5")):
        f = h5py.File(path, "r")
        if group not in f or name not in f[group]: continue
        d = f[group][name]
        shape = tuple(json.loads(d.attrs["global_shape"]))
        if out is None: out = np.full(int(np.prod(shape)), np.nan, dtype=np.float32)
        values, at_ = d[...], 0
        for start, length in f[group][name + ".runs"][...]:
            out[start:start + length] = values[at_:at_ + length]
            at_ += length
    assert out is not None and not np.isnan(out).any(), (group, name, "not covered by the shards")
    return out.reshape(shape)
value, exp_avg = json.load(open("value.json")), json.load(open("exp_avg.json"))
assert value["iteration"] == at == exp_avg["iteration"], (value["iteration"], at)
assert value["shape"] == [144, 48] and value["ranks"] == [2, 3] and len(value["histogram"]["counts"]) == 7, value
x = h5py.File("value.h5", "r")
assert x.attrs["kind"] == "value" and x.attrs["iteration"] == at and x.attrs["parameter"] == w
stats_match(value, x[w][...], "value vs its dump")
assert np.array_equal(x[w][...], assemble("model", w)), "the dump differs from the checkpoint of the same iteration"
m = h5py.File("exp_avg.h5", "r")[w + ".exp_avg"][...]
stats_match(exp_avg, m, "exp_avg vs its dump")
assert np.array_equal(m, assemble("optimizer/exp_avg", w)), "exp_avg differs from the checkpoint"
wte = h5py.File("wte.h5", "r")["transformer.wte.weight"][...]
assert np.array_equal(wte, assemble("model", "transformer.wte.weight")), "wte (vocabulary-parallel) differs"
r3 = json.load(open("rank3.json"))
assert r3["rank"] == 3 and r3["elements"] == 144 * 48 // 2, r3
# Rank 3 (tp 1) holds the second half of each of q, k and v's rows (Megatron's split of the fused QKV).
rows = np.concatenate([np.arange(h * 48 + 24, h * 48 + 48) for h in range(3)])
stats_match(r3, x[w][...][rows], "rank 3's part")
g = json.load(open("grad.json"))
gv = h5py.File("grad.h5", "r")[w + ".grad"][...]
assert g["iteration"] > at and g["kind"] == "grad" and g["nan"] == 0 and g["norm"] > 0, g
stats_match(g, gv, "grad vs its dump")
a = json.load(open("act.json"))
# micro-batch 3 x sequence 32 = 96 rows; c_fc's 4 x 48 = 192 columns split over tp 2
assert a["kind"] == "activation" and a["rank"] == 2 and a["micro_batch"] == 1 and a["shape"] == [96, 96], a
assert a["nan"] == 0 and a["inf"] == 0 and a["norm"] > 0 and a["iteration"] > at, a
d = json.load(open("actdump.json"))
dv = h5py.File("act.h5", "r")["layer1:ln2:backward"][...]
assert d["shape"] == [96, 48] and dv.shape == (96, 48), (d["shape"], dv.shape)
stats_match(d, dv, "layer1:ln2:backward vs its dump")
print(f"ok: tensor/dump after iteration {at}: value, exp_avg, wte, rank 3's part, the next step's gradient, two ops' results")
PY
}
check one
check launched launch --nproc-per-node 4 --master-port "$(free_port)" --
echo "PASS: tensor and dump equal numpy's statistics of the dump and the checkpoint, one process and under launch"
