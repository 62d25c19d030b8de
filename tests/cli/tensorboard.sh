#!/usr/bin/env bash
# --tensorboard-dir (issue 13, item 6): a tiny run with Megatron's switches writes event files that
# an independent reader (tests/cli/tfevents_decode.py: TFRecord framing, both CRC-32Cs checked, the
# Event protobufs decoded from the wire format) reads back with Megatron's tags at the right steps;
# the values are those of --metrics-file (float32-rounded), the timing ones its interval averages;
# a resumed run adds a second file whose steps continue, with its own switches; a write failure is
# one warning and the run goes on; bad TensorBoard flags and the wandb flags exit 2 writing nothing.
# When Python's tensorboard package is installed its EventAccumulator reads the files too.
source "$(dirname "$0")/common.bash"
decoder=$src_dir/tests/cli/tfevents_decode.py
make_corpus

small_train --train-iters 10 --exit-interval 6 --save ck --metrics-file m.jsonl --log-interval 2 \
  --eval-interval 3 --eval-iters 2 --tensorboard-dir tb/run --log-timers-to-tensorboard --log-throughput \
  --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --log-batch-size-to-tensorboard \
  --tensorboard-queue-size 100 > run1.log || { cat run1.log; fail "the first run failed"; }
grep -q "tensorboard: event files in tb/run" run1.log || { cat run1.log; fail "no start-up line for --tensorboard-dir"; }
# Resumed: the per-iteration scalars every 2nd iteration, without learning-rate and loss-scale.
small_train --train-iters 10 --load ck --save ck --metrics-file m.jsonl --log-interval 2 --eval-interval 3 \
  --eval-iters 2 --tensorboard-dir tb/run --tensorboard-log-interval 2 --no-log-learnig-rate-to-tensorboard \
  --no-log-loss-scale-to-tensorboard > run2.log || { cat run2.log; fail "the resumed run failed"; }
grep -q "loaded .*iteration 6" run2.log || { cat run2.log; fail "the second run did not resume at iteration 6"; }

python3 - "$decoder" m.jsonl tb/run "$(hostname)" <<'PY' || fail "the event files do not hold what Megatron writes"
import glob, importlib.util, json, math, os, re, struct, sys, time
spec = importlib.util.spec_from_file_location("tfevents_decode", sys.argv[1])
dec = importlib.util.module_from_spec(spec); spec.loader.exec_module(dec)
metrics, tb, host = sys.argv[2], sys.argv[3], sys.argv[4]
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
rows = [json.loads(l) for l in open(metrics)]
train = {j["iteration"]: j for j in rows if j["type"] == "train"}
evals = {j["iteration"]: j for j in rows if j["type"] == "eval"}
assert sorted(train) == list(range(1, 11)), sorted(train)
G, S = 6, 32  # small_train's global batch and sequence length

files = sorted(glob.glob(os.path.join(tb, "*")))
assert len(files) == 2, files
for f in files:
    assert re.fullmatch(r"events\.out\.tfevents\.\d{10}\.%s(\.\d+)?" % re.escape(host), os.path.basename(f)), f

def scalars(path):
    ev = dec.events(path)
    assert ev[0].get("file_version") == "brain.Event:2", ev[0]
    assert all("tag" in e for e in ev[1:]), "an event after the first without a scalar"
    walls = [e["wall_time"] for e in ev]
    assert walls == sorted(walls) and time.time() - 600 < walls[0] <= walls[-1] <= time.time() + 1, walls
    by_tag = {}
    for e in ev[1:]:
        by_tag.setdefault(e["tag"], []).append((e["step"], e["value"]))
    return by_tag

def expect(by_tag, tag, points, rel=0.0):
    got = by_tag.pop(tag, None)
    assert got is not None, "no tag %r" % tag
    assert [s for s, _ in got] == [s for s, _ in points], (tag, got, points)
    for (s, v), (_, want) in zip(got, points):
        ok = v == f32(want) if rel == 0 else abs(v - want) <= rel * abs(want)
        assert ok, (tag, s, v, want)

def series(by_tag, tag, its, value, rel=0.0):
    expect(by_tag, tag, [(i, value(i)) for i in its], rel)
    expect(by_tag, tag + " vs samples", [(train[i]["consumed_samples"], value(i)) for i in its], rel)
    expect(by_tag, tag + " vs tokens", [(train[i]["consumed_samples"] * S, value(i)) for i in its], rel)

def interval_checks(by_tag, boundaries, first):
    # Megatron: averages over the iterations since the last --log-interval boundary.
    prev, it_time, thr = first - 1, [], []
    for b in boundaries:
        its = range(prev + 1, b + 1)
        secs = [train[i]["ms_per_iter"] / 1e3 for i in its]
        it_time.append((b, sum(secs) / len(secs)))
        thr.append((b, sum(train[i]["model_tflops"] * t for i, t in zip(its, secs)) / sum(secs)))
        prev = b
    expect(by_tag, "iteration-time", it_time, rel=1e-6)
    expect(by_tag, "throughput", thr, rel=1e-5)
    for tag in [t for t in by_tag if t.endswith("-time")]:  # IterationStats::timers, when filled in
        assert [s for s, _ in by_tag.pop(tag)] == boundaries, tag

# The first run: every iteration 1..6, timers at the log interval, validation at 3 and 6.
a = scalars(files[0])
its = range(1, 7)
series(a, "lm loss", its, lambda i: train[i]["lm_loss"])
series(a, "learning-rate", its, lambda i: train[i]["lr"])
series(a, "grad-norm", its, lambda i: train[i]["grad_norm"])
series(a, "batch-size", its, lambda i: G)
series(a, "loss-scale", its, lambda i: 1.0)
series(a, "world-size", its, lambda i: 1)
interval_checks(a, [2, 4, 6], 1)
series(a, "lm loss validation", [3, 6], lambda i: evals[i]["validation_loss"])
series(a, "lm loss validation ppl", [3, 6], lambda i: math.exp(min(20, evals[i]["validation_loss"])))
assert not a, "unexpected tags in the first file: %s" % sorted(a)

# The resumed run: steps continue at 7; every 2nd iteration; no learning-rate, loss-scale,
# world-size, timing or perplexity tags (not asked for this time).
b = scalars(files[1])
series(b, "lm loss", [8, 10], lambda i: train[i]["lm_loss"])
series(b, "grad-norm", [8, 10], lambda i: train[i]["grad_norm"])
series(b, "batch-size", [8, 10], lambda i: G)
series(b, "lm loss validation", [9], lambda i: evals[i]["validation_loss"])
assert not b, "unexpected tags in the second file: %s" % sorted(b)

# A flipped byte is caught by the reader (so the CRCs above were really checked).
blob = bytearray(open(files[0], "rb").read())
blob[len(blob) // 2] ^= 0x40
open("corrupt.tfevents", "wb").write(blob)
try:
    dec.events("corrupt.tfevents")
    raise AssertionError("a corrupted file was read without an error")
except ValueError as e:
    assert "CRC mismatch" in str(e), e

if importlib.util.find_spec("tensorboard"):
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(tb, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("lm loss")]
    assert got == [(i, f32(train[i]["lm_loss"])) for i in [1, 2, 3, 4, 5, 6, 8, 10]], got
    print("ok: TensorBoard's EventAccumulator reads the same 'lm loss'")
print("ok: two event files, Megatron's tags and steps, the metrics file's values")
PY
echo "ok: the event files read back through an independent decoder"

# A write failure (the disk fills after the first iteration's events): one warning, training goes
# on to the end, and the file keeps the records written before it.
TROUPE_FAULT_IO=write@2+:ENOSPC small_train --train-iters 4 --tensorboard-dir tbfull > full.log 2>&1 ||
  { cat full.log; fail "a TensorBoard write failure stopped training"; }
(( $(grep -c "warning: --tensorboard-dir:.*No space left on device" full.log) == 1 )) ||
  { cat full.log; fail "expected exactly one warning about the failed write"; }
grep -q "finished at iteration 4/4" full.log || { cat full.log; fail "training did not finish"; }
python3 - "$decoder" tbfull <<'PY' || fail "the event file written before the failure does not read back"
import glob, importlib.util, sys
spec = importlib.util.spec_from_file_location("d", sys.argv[1]); d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(d)
(f,) = glob.glob(sys.argv[2] + "/events.out.tfevents.*")
ev = d.events(f)
assert ev[0]["file_version"] == "brain.Event:2" and {e["step"] for e in ev[1:] if e["tag"] == "lm loss"} == {1}, ev
PY
echo "ok: a failed write is one warning; training goes on"

# --log-params-norm and --log-num-zeros-in-grad: Megatron's progress-line fields after the grad norm,
# its num-zeros and params-norm tags with the metrics file's values, and the last iteration's
# params norm is the L2 norm of the parameters the run saved (read from `troupe ckpt export`'s
# safetensors; no vocabulary padding, so the export holds every parameter once).
small_train --train-iters 3 --lr-warmup-iters 1 --log-interval 1 --log-params-norm --log-num-zeros-in-grad --tensorboard-dir tbn \
  --metrics-file mn.jsonl --save ckn --make-vocab-size-divisible-by 1 > norms.log ||
  { cat norms.log; fail "the run with --log-params-norm --log-num-zeros-in-grad failed"; }
(( $(grep -cE '\| grad norm: [0-9.]+ \| num zeros: [0-9]+\.0 \| params norm: [0-9.]+ \| number of skipped' norms.log) == 3 )) ||
  { cat norms.log; fail "the progress lines lack Megatron's ' num zeros: N.0 | params norm: X |'"; }
"$troupe" ckpt export --load ckn --output hfn > /dev/null
python3 - "$decoder" tbn mn.jsonl hfn/model.safetensors <<'PY' || fail "the params norm or zero count is not Megatron's"
import glob, importlib.util, json, math, struct, sys
spec = importlib.util.spec_from_file_location("d", sys.argv[1]); d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(d)
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
train = {j["iteration"]: j for j in map(json.loads, open(sys.argv[3])) if j["type"] == "train"}
assert sorted(train) == [1, 2, 3], sorted(train)
(f,) = glob.glob(sys.argv[2] + "/events.out.tfevents.*")
by_tag = {}
for e in d.events(f)[1:]:
    by_tag.setdefault(e["tag"], []).append((e["step"], e["value"]))
for tag, key in [("num-zeros", "num_zeros_in_grad"), ("params-norm", "params_norm")]:
    assert by_tag[tag] == [(i, f32(train[i][key])) for i in (1, 2, 3)], (tag, by_tag[tag])
    assert by_tag[tag + " vs samples"] == [(train[i]["consumed_samples"], f32(train[i][key])) for i in (1, 2, 3)], tag
raw = open(sys.argv[4], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
total = 0.0
for name, e in header.items():
    if name == "__metadata__" or name == "lm_head.weight":  # tied to wte: one parameter, counted once
        continue
    assert e["dtype"] == "F32", (name, e["dtype"])
    b, end = e["data_offsets"]
    total += sum(x * x for x in struct.unpack("<%df" % ((end - b) // 4), raw[8 + n + b:8 + n + end]))
norm, got = math.sqrt(total), train[3]["params_norm"]
assert abs(got - norm) <= 1e-5 * norm, (got, norm)
zeros = [train[i]["num_zeros_in_grad"] for i in (1, 2, 3)]
assert all(isinstance(z, int) and 0 <= z < 70512 // 10 for z in zeros), zeros
print(f"ok: params norm {got:.6f} = the saved parameters' {norm:.6f}; zero counts {zeros}")
PY
echo "ok: --log-params-norm and --log-num-zeros-in-grad in the log, TensorBoard and the metrics file"

# Bad input: exit 2, the flag named, nothing written.
echo x > a_file
expect_refused() {
  local what=$1 pattern=$2
  shift 2
  set +e
  small_train --train-iters 2 --save ck_bad "$@" > bad.out 2> bad.err
  local rc=$?
  set -e
  (( rc == 2 )) || { cat bad.out bad.err; fail "$what: exit $rc, not 2"; }
  grep -q -- "$pattern" bad.err || { cat bad.err; fail "$what: the message does not say '$pattern'"; }
  [[ ! -e ck_bad && ! -e tb_bad ]] || fail "$what: a refused run wrote something"
}
expect_refused "--tensorboard-dir on a file" "--tensorboard-dir.*a_file/tb.*not a directory" --tensorboard-dir a_file/tb
expect_refused "--tensorboard-log-interval 0" "--tensorboard-log-interval must be positive" \
  --tensorboard-dir tb_bad --tensorboard-log-interval 0
# The wandb flags share one reason: one problem names them all.
expect_refused "--wandb-project" "--wandb-project p, --wandb-exp-name e: troupe does not write wandb runs.*--tensorboard-dir" \
  --tensorboard-dir tb_bad --wandb-project p --wandb-exp-name e
echo "ok: bad TensorBoard flags and the wandb flags exit 2, naming the flag, writing nothing"
echo "PASS: --tensorboard-dir writes Megatron's TensorBoard tags"
