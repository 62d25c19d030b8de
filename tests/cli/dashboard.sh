#!/usr/bin/env bash
# troupe train --dashboard and the inspector's stages, plan and history (docs/INSPECT.md): a running
# tp 2 x pp 2 job (4 ranks, 1F1B, 2 micro-batches) serves its page at the URL it prints and writes
# into the inspect file; without the token, or with another, every path answers 401 and no data.
# `stages` shares add up and count each micro-batch's F and B once per step, `plan` holds the
# table, `history` the iterations. A port in use and a malformed address are refused. Headless
# Chromium opens the page: a lane with measured spans for each of the 4 ranks, and a loss curve
# whose points are the losses the job printed. The dashboard goes with the job. Under troupe launch
# (4 processes) rank 0's serves it and stages gathers every rank. A stalled job's page draws the
# waits with rank 1 the culprit. A dense job's `moe` has no layers and its page no MoE panel; an MoE
# job's (tests/api/workers/moe_train.cpp) `moe` holds the load of its last iteration, and its page
# draws each MoE layer's tokens per expert. Chromium absent: those parts are skipped, said so.
# TROUPE_DASHBOARD_SCREENSHOT=PATH: also save the page as a PNG there (docs/dashboard.png).
source "$(dirname "$0")/common.bash"
model=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --micro-batch-size 3
       --global-batch-size 6 --mock-data --tokenizer-type ByteLevelTokenizer --log-interval 1
       --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)

"$troupe" train "${model[@]}" --train-iters 100000 --dashboard 0 --inspect-file run/insp.json \
  --metrics-file metrics.jsonl > train.log 2>&1 &
job=$!
kill_on_exit $job
wait_for_file run/insp.json
url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dashboard'])" run/insp.json)
[[ $url =~ ^http://127\.0\.0\.1:[0-9]+/\?token=[0-9a-f]{64}$ ]] || fail "the inspect file's dashboard URL is \"$url\""
grep -qF "dashboard on $url" train.log || { cat train.log; fail "the dashboard's URL was not printed"; }
base=${url%%\?*}
token=${url##*token=}
[[ $token != $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['token'])" run/insp.json) ]] ||
  fail "the dashboard's token is the job token"

# No token, another token: 401 and nothing of the job, on every path.
for path in "" api/status api/where api/stages api/plan api/history api/moe api/stragglers; do
  code=$(curl -s -o none.txt -w '%{http_code}' "$base$path")
  [[ $code == 401 ]] || fail "$base$path without a token: HTTP $code"
  code=$(curl -s -o wrong.txt -w '%{http_code}' -H "X-Troupe-Token: ${token//?/0}" "$base$path?token=${token//?/1}")
  [[ $code == 401 ]] || fail "$base$path with another token: HTTP $code"
  ! grep -q '"ranks"\|<svg' none.txt wrong.txt || fail "$base$path answered data without the token"
done
curl -s -f -H "X-Troupe-Token: $token" "${base}api/status" > status.json || fail "the token's request failed"
python3 -c "import json,sys; assert len(json.load(open(sys.argv[1]))['ranks']) == 4" status.json ||
  fail "api/status does not list the 4 ranks"

# A port in use, a malformed address: refused, exit code 2, saying what to do.
port=${base#http://127.0.0.1:}
port=${port%/}
set +e
"$troupe" train "${model[@]}" --train-iters 1 --dashboard "$port" > inuse.log 2>&1
rc_inuse=$?
"$troupe" train "${model[@]}" --train-iters 1 --dashboard 127.0.0.1:http > badflag.log 2>&1
rc_flag=$?
set -e
(( rc_inuse == 2 )) && grep -q "cannot listen on 127.0.0.1:$port (in use" inuse.log ||
  { cat inuse.log; fail "a dashboard port in use: rc $rc_inuse"; }
(( rc_flag == 2 )) && grep -qF -- '--dashboard is "127.0.0.1:http", not [HOST:]PORT' badflag.log ||
  { cat badflag.log; fail "a malformed --dashboard: rc $rc_flag"; }

# Some iterations first: the history and the stages need them.
for _ in $(seq 1 600); do
  n=$(grep -c '"type": *"train"' metrics.jsonl 2>/dev/null || true)
  (( ${n:-0} >= 4 )) && break
  sleep 0.1
done
"$troupe" inspect run/insp.json --exec "stages --last 3 --spans 3" --json > stages.json || fail "stages failed"
"$troupe" inspect run/insp.json --exec plan --json > plan.json || fail "plan failed"
"$troupe" inspect run/insp.json --exec "plan 3" --json > plan3.json || fail "plan 3 failed"
"$troupe" inspect run/insp.json --exec "history --last 2" --json > history.json || fail "history failed"
python3 - stages.json plan.json plan3.json history.json <<'PY' || fail "stages, plan or history are not what docs/INSPECT.md says"
import json, sys
stages, plan, plan3, history = (json.load(open(p)) for p in sys.argv[1:5])
m = 2  # global batch 6 / (micro-batch 3 x dp 1)
assert stages["schedule"]["name"] == "1f1b" and stages["schedule"]["micro_batches"] == m, stages["schedule"]
assert 1 <= len(stages["iterations"]) <= 3, stages["iterations"]
assert abs(stages["predicted"]["bubble"] - 1 / 3) < 1e-12 and abs(stages["predicted"]["formula"] - 1 / 3) < 1e-12
assert sorted(r["rank"] for r in stages["ranks"]) == [0, 1, 2, 3]
for r in stages["ranks"]:
    assert abs(r["busy"] + r["idle"] - 1) < 1e-9, r
    assert 0 < r["busy"] < 1 and 0 <= r["bubble"] < 1, r
    assert len(r["steps"]) == len(stages["iterations"]), r
    for s in r["steps"]:
        assert (s["F"], s["B"], s["W"]) == (m, m, 0), s
        passes = sorted((k, micro, chunk) for k, micro, chunk, _, _ in s["spans"] if k in ("forward", "backward"))
        assert passes == sorted([(k, i, 0) for k in ("forward", "backward") for i in range(m)]), passes
        assert s["f_ms"] > 0 and s["b_ms"] > 0 and s["step_ms"] >= s["f_ms"] + s["b_ms"], s
assert [s["stage"] for s in plan["stages"]] == [0, 1], plan
for st in plan["stages"]:
    acts = sorted((a["kind"], a["micro"], a["chunk"]) for a in st["actions"])
    assert acts == sorted([(k, i, 0) for k in "FB" for i in range(m)]), acts
    assert sorted(a["rank"] for a in st["at"]) == [2 * st["stage"], 2 * st["stage"] + 1], st["at"]
    for a in st["at"]:
        assert -1 <= a["action"] < len(st["actions"]), a
assert [s["stage"] for s in plan3["stages"]] == [1] and [a["rank"] for a in plan3["stages"][0]["at"]] == [3]
assert len(history["iteration"]) == 2 and history["iteration"][1] == history["iteration"][0] + 1, history
print("ok: stages of iterations", stages["iterations"], "bubble", round(stages["bubble"], 3), "predicted 1/3;",
      "plan and history")
PY
# A dense model: `moe` has no layers to show.
"$troupe" inspect run/insp.json --exec moe --json > dense_moe.json || fail "moe failed on a dense job"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['layers'] == [] and j['iteration'] == 0, j" \
  dense_moe.json || fail "a dense job's moe: $(cat dense_moe.json)"
"$troupe" inspect run/insp.json --exec moe | grep -q "no MoE layers have reported" || fail "a dense job's moe for people"
"$troupe" inspect run/insp.json --exec "stages --last 3" > stages.txt || fail "stages for people failed"
grep -q "^  rank 3 (pp 1, tp 1, dp 0): busy [0-9.]*%, idle" stages.txt || { cat stages.txt; fail "stages for people"; }
"$troupe" inspect run/insp.json --exec "plan 0" > plan.txt || fail "plan for people failed"
grep -q "^stage 0: .*F0.*F1.*B0.*B1" plan.txt || { cat plan.txt; fail "plan for people lacks the table"; }
set +e
"$troupe" inspect run/insp.json --exec "stages --last 0" > bad.txt 2>&1
rc_bad=$?
set -e
(( rc_bad == 2 )) && grep -q "takes a whole number from 1 to 16" bad.txt || { cat bad.txt; fail "stages --last 0: rc $rc_bad"; }

if ! command -v chromium > /dev/null; then
  echo "skipped: no chromium (the page was not opened in a browser)"
else
  chrome=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$work/chrome"
          --virtual-time-budget=6000 --window-size=1400,1100)
  timeout 120 "${chrome[@]}" --dump-dom "$url" > dom.html 2> chromium.err || { tail chromium.err; fail "chromium failed"; }
  python3 - dom.html metrics.jsonl train.log <<'PY' || { head -c 3000 dom.html; fail "the page did not draw the job"; }
import html.parser, json, re, sys
dom, metrics, log = sys.argv[1:4]

class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.lanes, self.curves, self.body = [], {}, {}, {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "g" and "lane" in a.get("class", "").split():
            self.lanes[int(a["data-rank"])] = {"spans": int(a["data-spans"]), "rects": 0}
        cls = a.get("class", "").split()
        if tag == "rect" and "span" in cls:
            lane = next((s for s in reversed(self.stack) if s[0] == "lane"), None)
            if lane is not None:
                self.lanes[lane[1]]["rects"] += 1
        if tag == "g" and "curve" in cls:
            self.curves[a["data-series"]] = None
            self.current_curve = a["data-series"]
        if tag == "polyline" and getattr(self, "current_curve", None):
            self.curves[self.current_curve] = (a.get("data-iterations", ""), a.get("data-values", ""))
            self.points = getattr(self, "points", {})
            self.points[self.current_curve] = [float(xy.split(",")[0]) for xy in a.get("points", "").split()]
        if tag == "text" and "last-label" in cls and getattr(self, "current_curve", None):
            self.labels = getattr(self, "labels", {})
            self.labels[self.current_curve] = float(a["x"])
        self.in_header = tag == "span" and a.get("id") == "iteration"
        if tag in ("g", "svg"):
            kind = ("lane", int(a["data-rank"])) if tag == "g" and "lane" in cls else (tag, None)
            self.stack.append(kind)
    def handle_endtag(self, tag):
        if tag in ("g", "svg") and self.stack:
            self.stack.pop()
    def handle_data(self, data):
        if getattr(self, "in_header", False):
            self.header = data
            self.in_header = False

p = Page()
p.feed(open(dom).read())
assert int(p.body.get("data-updates", 0)) >= 1, "the page never got an answer from the job"
assert sorted(p.lanes) == [0, 1, 2, 3], p.lanes
for r, lane in p.lanes.items():
    assert lane["spans"] > 0 and lane["rects"] == lane["spans"], (r, lane)
its, values = p.curves["loss"]
its, values = [int(x) for x in its.split()], [float(x) for x in values.split()]
assert len(its) >= 2 and len(its) == len(values), (its, values)
train = {j["iteration"]: j["lm_loss"] for j in map(json.loads, open(metrics)) if j.get("type") == "train"}
printed = {int(i): float(l) for i, l in re.findall(r"iteration +(\d+)/ *\d+ \|.*?lm loss: ([0-9.E+-]+)", open(log).read())}
for i, v in zip(its, values):
    assert v == train[i], (i, v, train[i])            # the job's own number, to the last bit
    assert abs(v - printed[i]) <= 5e-7 * abs(v), (i, v, printed[i])  # and what it printed (7 digits)
assert p.curves.get("lr") and p.curves.get("grad_norm"), p.curves.keys()
# The header's iteration is the curves' last; each curve's last-point label sits right of the curve.
assert p.header == f"iteration {its[-1]}", (p.header, its[-1])
for series in ("loss", "lr", "grad_norm"):
    assert p.labels[series] > max(p.points[series]), (series, p.labels[series], max(p.points[series]))
# A dense model has no MoE layers: the expert-load panel stays hidden.
assert 'id="moe-box" hidden' in open(dom).read(), "a dense job's page shows the MoE panel"
print(f"ok: the page drew lanes for ranks 0-3 ({', '.join(str(l['spans']) for l in p.lanes.values())} spans) "
      f"and a loss curve of {len(its)} points equal to the printed losses")
PY
  shot=${TROUPE_DASHBOARD_SCREENSHOT:-$work/dashboard.png}
  timeout 120 "${chrome[@]}" --hide-scrollbars --screenshot="$shot" "$url" > /dev/null 2>> chromium.err ||
    { tail chromium.err; fail "chromium's screenshot failed"; }
  [[ $(stat -c %s "$shot") -gt 20000 ]] || fail "the screenshot $shot is too small to show the page"
fi

# The job ends on SIGINT, and its dashboard with it.
kill -INT $job
wait $job || true
kill_on_exit
grep -q "stopped early" train.log || { cat train.log; fail "the job did not stop cleanly"; }
! curl -s -m 2 -H "X-Troupe-Token: $token" "${base}api/status" > /dev/null || fail "the dashboard outlived the job"

# Under troupe launch (4 processes, one rank each): rank 0's process serves the dashboard and its
# stages gather every rank's steps from the others' inspectors.
"$troupe" launch --nproc-per-node 4 --master-port "$(free_port)" -- train "${model[@]}" --train-iters 100000 --dashboard 0 \
  --inspect-file launched.json > launched.log 2>&1 &
job=$!
kill_on_exit $job  # the ranks follow their launcher (PR_SET_PDEATHSIG)
wait_for_file launched.json
(( $(grep -c "dashboard on http" launched.log) == 1 )) || { cat launched.log; fail "not one dashboard under launch"; }
launched_url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dashboard'])" launched.json)
for _ in $(seq 1 100); do
  "$troupe" inspect launched.json --exec "stages --last 4" --json > launched_stages.json 2> /dev/null &&
    python3 -c "import json,sys; sys.exit(0 if len(json.load(open(sys.argv[1]))['iterations']) == 4 else 1)" \
      launched_stages.json 2> /dev/null && break
  sleep 0.2
done
curl -s -f -H "X-Troupe-Token: ${launched_url##*token=}" "${launched_url%%\?*}api/stages" > launched_api.json ||
  fail "the launched job's api/stages failed"
python3 - launched_stages.json launched_api.json <<'PY' || { cat launched.log; fail "stages under launch"; }
import json, sys
for path in sys.argv[1:3]:
    s = json.load(open(path))
    assert "unreachable" not in s and sorted(r["rank"] for r in s["ranks"]) == [0, 1, 2, 3], s
    assert s["iterations"], s
    for r in s["ranks"]:
        assert abs(r["busy"] + r["idle"] - 1) < 1e-9 and all((x["F"], x["B"]) == (2, 2) for x in r["steps"]), r
print("ok: under launch, stages of", json.load(open(sys.argv[1]))["iterations"], "from the 4 processes")
PY
kill -INT $job
wait $job || true
kill_on_exit

# A stalled job (rank 1 stops answering at iteration 3): the page draws the wait-for graph, rank 1
# the culprit, with the edges `where` gives (tests/cli/inspect.sh checks those).
if command -v chromium > /dev/null; then
  TROUPE_FAULT_HANG=rank1@3 "$troupe" train "${model[@]}" --train-iters 8 --dashboard 0 --inspect-file stall.json \
    --distributed-timeout-minutes 0.5 > stall.log 2>&1 &
  job=$!
  kill_on_exit $job
  wait_for_file stall.json
  stall_url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dashboard'])" stall.json)
  for _ in $(seq 1 100); do
    "$troupe" inspect stall.json --exec where --json > where.json 2> /dev/null || true
    python3 -c "import json,sys; w=json.load(open(sys.argv[1])); sys.exit(0 if w.get('culprits') == [1] and
      min(r['seconds_in_state'] for r in w['ranks'] if r['doing'] == 'waiting') > 1.2 else 1)" where.json 2> /dev/null && break
    sleep 0.1
  done
  timeout 120 "${chrome[@]}" --virtual-time-budget=3000 --dump-dom "$stall_url" > stall_dom.html 2>> chromium.err ||
    fail "chromium failed on the stalled job"
  python3 - stall_dom.html <<'PY' || { cat stall.log; fail "the page did not draw the stalled job's waits"; }
import re, sys
dom = open(sys.argv[1]).read()
culprits = re.findall(r'<g class="node" data-rank="(\d+)" data-culprit="true"', dom)
edges = set(re.findall(r'<line class="edge" data-from="(\d+)" data-to="(\d+)"', dom))
assert culprits == ["1"], culprits
assert edges == {("0", "1"), ("2", "0"), ("3", "1")}, edges
assert 'id="where-box" hidden' not in dom
print("ok: the page drew the waits of the stalled job, rank 1 the culprit")
PY
  kill -9 $job 2> /dev/null || true
  wait $job 2> /dev/null || true
  kill_on_exit
fi
# An MoE model (tests/api/workers/moe_train.cpp: troupe::train, tp 2 x pp 2, layers 1 and 3 MoE
# layers of 4 and 6 experts): `moe` answers each layer's load of the last iteration, and the page
# draws a chart per MoE layer, one bar per expert with the tokens routed to it and kept.
worker=${TROUPE_MOE_TRAIN_BIN:-$src_dir/build/tests/moe_train}
if [[ ! -x $worker ]]; then
  echo "skipped: the moe_train worker is not built ($worker): no MoE page"
else
  "$worker" moe.jsonl --iters 100000 --tp 2 --pp 2 --dashboard --inspect-file moe.inspect > moe.log 2>&1 &
  job=$!
  kill_on_exit $job
  wait_for_file moe.inspect
  for _ in $(seq 1 600); do
    n=$(grep -c '"moe"' moe.jsonl 2>/dev/null || true)
    (( ${n:-0} >= 2 )) && break
    sleep 0.1
  done
  "$troupe" inspect moe.inspect --exec moe --json > moe.json || fail "moe failed"
  "$troupe" inspect moe.inspect --exec moe > moe.txt || fail "moe for people failed"
  grep -q "^layer 3: 6 experts, 4 micro-batches, 256 tokens routed, [0-9]* dropped" moe.txt ||
    { cat moe.txt; fail "moe for people lacks layer 3's line"; }
  (( $(grep -c "^ *[0-9] *[0-9]* *[0-9]* *[0-9.]*% #*" moe.txt) == 10 )) || { cat moe.txt; fail "moe for people: not 4 + 6 experts"; }
  moe_url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dashboard'])" moe.inspect)
  if command -v chromium > /dev/null; then
    timeout 120 "${chrome[@]}" --dump-dom "$moe_url" > moe_dom.html 2>> chromium.err || fail "chromium failed on the MoE job"
  fi
  kill -INT $job
  wait $job || { cat moe.log; fail "the MoE job did not stop cleanly"; }
  kill_on_exit
  python3 - moe.json moe.jsonl moe_dom.html <<'PY' || { cat moe.log; fail "the MoE load is not what the job reported"; }
import html.parser, json, os, sys
answer, rows = json.load(open(sys.argv[1])), [json.loads(l) for l in open(sys.argv[2])]
by_it = {j["iteration"]: j for j in rows}
assert answer["iteration"] in by_it, answer
j = by_it[answer["iteration"]]
assert answer["moe_loss"] == j["moe_loss"], (answer, j)
assert [l["layer"] for l in answer["layers"]] == [1, 3] and [l["experts"] for l in answer["layers"]] == [4, 6], answer
for a, b in zip(answer["layers"], j["moe"]):
    for key in ("layer", "micro_batches", "routed", "kept", "dropped", "lb_loss", "z_loss"):
        assert a[key] == b[key], (key, a, b)
if os.path.exists(sys.argv[3]):
    class Page(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.layers, self.box_hidden, self.cur = {}, None, None
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            cls = a.get("class", "").split()
            if a.get("id") == "moe-box":
                self.box_hidden = "hidden" in a
            if tag == "g" and "moe-layer" in cls:
                self.cur = int(a["data-layer"])
                self.layers[self.cur] = {"routed": [int(x) for x in a["data-routed"].split()],
                                         "kept": [int(x) for x in a["data-kept"].split()], "bars": []}
            if tag == "g" and "moe-expert" in cls:
                self.layers[self.cur]["bars"].append((int(a["data-routed"]), int(a["data-kept"])))
            if tag == "rect" and "moe-kept" in cls:
                self.layers[self.cur].setdefault("kept_rects", 0)
                self.layers[self.cur]["kept_rects"] += 1
    p = Page()
    p.feed(open(sys.argv[3]).read())
    assert p.box_hidden is False, "the MoE panel is hidden on an MoE job's page"
    assert sorted(p.layers) == [1, 3], p.layers
    for layer, experts in ((1, 4), (3, 6)):
        l = p.layers[layer]
        assert len(l["bars"]) == experts and l["kept_rects"] == experts, (layer, l)
        assert l["bars"] == list(zip(l["routed"], l["kept"])), (layer, l)
        assert sum(l["routed"]) == 8 * 16 * 2 and all(k <= r for r, k in l["bars"]), (layer, l)
        # The page's iteration is one the job reported: its counts are that iteration's.
        assert any(m["layer"] == layer and m["routed"] == l["routed"] and m["kept"] == l["kept"]
                   for r in rows for m in r["moe"]), (layer, l)
    print("ok: the page drew the expert load of MoE layers 1 and 3 (4 and 6 experts) from the job's numbers")
print("ok: moe answered iteration", answer["iteration"], "with the metrics file's loads")
PY
fi
echo "PASS: troupe train --dashboard: token required, stages/plan/history, the page in Chromium from live data"
