#!/usr/bin/env bash
# troupe serve (docs/SERVE.md) through real HTTP requests: Megatron's PUT /api gives, for two prompts
# greedily, the tokens and log-probabilities `troupe generate` gives (prompt + generated, as Megatron
# returns them); eight clients at once, each sampling with its own seed, get what each gets alone
# (continuous batching changes no one's tokens); /v1/completions streamed as server-sent events adds
# up to the unstreamed text; bad requests get 400 with Megatron's reasons; /metrics counts them in
# Prometheus' format; a bearer token, when set, is required, and binding beyond loopback without one
# is refused (exit 2); the page at / streams a completion in headless Chromium; a server decoding on
# tp 3 x pp 2 shard actors answers as the one-decoder server does, and so does one whose tp 3 ranks
# are the processes of troupe launch (and killing one of them ends the job, no process left).
source "$(dirname "$0")/common.bash"
make_corpus
small_train --train-iters 60 --save ck --num-threads 1 --hidden-dropout 0 --attention-dropout 0 > train.log 2>&1 ||
  { cat train.log; fail "training failed"; }
"$troupe" generate --load ck --prompt "The " --prompt "Q: Why did" --top-k 1 --tokens-to-generate 10 --json --logprobs \
  --num-threads 1 > gen.jsonl || fail "generate failed"
"$troupe" generate --load ck --prompt "The " --beam-width 3 --tokens-to-generate 10 --json --num-threads 1 > beam.json ||
  fail "generate --beam-width failed"

serve_pid=""
stop_server() { [[ -n "$serve_pid" ]] && kill "$serve_pid" 2> /dev/null && wait "$serve_pid" 2> /dev/null; serve_pid=""; }
trap 'stop_server; rm -rf "$work"' EXIT
start_command() {  # LOG COMMAND...: starts a troupe serve COMMAND in the background, sets $serve_pid and $port
  local log=$1
  shift
  "$@" > "$log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 1 100); do
    # The server's shell may not have opened the log yet (the redirection is the background job's).
    port=$(sed -n 's/.*:\([0-9]*\) (PUT \/api.*/\1/p' "$log" 2> /dev/null || true)
    [[ -n "$port" ]] && return 0
    sleep 0.1
  done
  cat "$log"
  fail "troupe serve did not start"
}
start_server() {  # LOG FLAGS...: starts troupe serve on a free port, sets $port
  local log=$1
  shift
  start_command "$log" "$troupe" serve --load ck --port 0 --num-threads 1 "$@"
}
# answers_as_one_decoder WHAT [TOKEN_FILE]: the server at $port gives troupe generate's greedy tokens,
# and 8 concurrent seeded clients what each got alone from the one-decoder server (alone.json).
answers_as_one_decoder() {
  python3 - "$port" gen.jsonl alone.json "$1" "${2:-}" <<'PY'
import http.client, json, sys, threading
port, what = int(sys.argv[1]), sys.argv[4]
auth = {"Authorization": "Bearer " + open(sys.argv[5]).read().strip()} if sys.argv[5] else {}
def call(body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("PUT", "/api", json.dumps(body), {"Content-Type": "application/json", **auth})
    r = c.getresponse()
    return r.status, r.read()
gen = [json.loads(l) for l in open(sys.argv[2])]
status, body = call({"prompts": [g["prompt"] for g in gen], "tokens_to_generate": 10, "top_k": 1})
assert status == 200, (status, body)
for i, g in enumerate(gen):
    assert json.loads(body)["tokens"][i] == list(g["prompt"].encode()) + g["tokens"], (body, g)
reqs = [{"prompts": [f"Q{k}: what"], "tokens_to_generate": 14, "top_p": 0.9, "temperature": 1.2, "random_seed": k}
        for k in range(8)]
together = [None] * 8
def run(k):
    together[k] = json.loads(call(reqs[k])[1])["tokens"]
threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert together == json.load(open(sys.argv[3])), what + " gave other tokens than one decoder"
print("ok: on " + what + ", greedy and 8 concurrent seeded clients get the one decoder's tokens")
PY
}
start_server serve.log
python3 - "$port" gen.jsonl beam.json <<'PY' || fail "the server's answers are wrong"
import http.client, json, sys, threading
port = int(sys.argv[1])
def call(method, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body if isinstance(body, (str, bytes)) else json.dumps(body),
              {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data

# Megatron's API against troupe generate.
gen = [json.loads(l) for l in open(sys.argv[2])]
status, body = call("PUT", "/api", {"prompts": [g["prompt"] for g in gen], "tokens_to_generate": 10, "top_k": 1,
                                     "logprobs": True})
assert status == 200, (status, body)
out = json.loads(body)
for i, g in enumerate(gen):
    prompt_ids = list(g["prompt"].encode())
    assert out["tokens"][i] == prompt_ids + g["tokens"], (out["tokens"][i], g["tokens"])
    assert out["text"][i] == g["prompt"] + g["text"], (out["text"][i], g["text"])
    want = g["prompt_log_probs"] + g["log_probs"]
    # The same tokens; the log-probabilities to float32 rounding (the rows batched differ)
    assert len(out["logprobs"][i]) == len(want) and max(abs(a - b) for a, b in zip(out["logprobs"][i], want)) < 1e-5
    assert len(out["segments"][i]) == len(out["tokens"][i])
print("ok: PUT /api equals troupe generate")

# Beam search (Megatron's beam_width): the hypotheses troupe generate --beam-width finds, best first.
want = json.load(open(sys.argv[3]))
status, body = call("PUT", "/api", {"prompts": ["The "], "tokens_to_generate": 10, "beam_width": 3})
assert status == 200, (status, body)
out = json.loads(body)
assert out["text"] == ["The " + b["text"] for b in want["beams"]], (out["text"], want)
assert all(abs(a - b["score"]) < 1e-5 for a, b in zip(out["scores"], want["beams"])), (out["scores"], want)
assert out["scores"] == sorted(out["scores"], reverse=True) and len(out["scores"]) == 3, out["scores"]
print("ok: beam search over PUT /api equals troupe generate --beam-width")

# Eight clients at once, each with its own seed: what each gets alone.
reqs = [{"prompts": [f"Q{k}: what"], "tokens_to_generate": 14, "top_p": 0.9, "temperature": 1.2, "random_seed": k}
        for k in range(8)]
alone = [json.loads(call("PUT", "/api", r)[1])["tokens"] for r in reqs]
together = [None] * 8
def run(k):
    together[k] = json.loads(call("PUT", "/api", reqs[k])[1])["tokens"]
threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert together == alone, "a request's tokens changed with the others beside it"
assert len({json.dumps(a) for a in alone}) > 1, "every seed gave the same tokens"
json.dump(alone, open("alone.json", "w"))  # the layout server below must give the same
print("ok: 8 concurrent clients get what each gets alone")

# Completions, unstreamed and streamed.
req = {"prompt": "The ", "max_tokens": 10, "temperature": 0, "model": "tiny"}
status, body = call("POST", "/v1/completions", req)
assert status == 200, (status, body)
plain = json.loads(body)
assert plain["object"] == "text_completion" and plain["model"] == "tiny", plain
assert plain["choices"][0]["text"] == gen[0]["text"], (plain, gen[0])
assert plain["usage"]["prompt_tokens"] == 4 and plain["usage"]["completion_tokens"] == len(gen[0]["tokens"]), plain
status, body = call("POST", "/v1/completions", {**req, "stream": True})
assert status == 200, status
events = [l[len("data: "):] for l in body.split("\n") if l.startswith("data: ")]
assert events[-1] == "[DONE]", events[-3:]
chunks = [json.loads(e) for e in events[:-1]]
streamed = "".join(c["choices"][0]["text"] for c in chunks)
assert streamed == plain["choices"][0]["text"], (streamed, plain)
assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop") and len(chunks) >= 2, chunks[-1]
assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]), chunks
# stream_options.include_usage: one more chunk before [DONE], no choices, the unstreamed usage.
status, body = call("POST", "/v1/completions", {**req, "stream": True, "stream_options": {"include_usage": True}})
events = [l[len("data: "):] for l in body.split("\n") if l.startswith("data: ")]
assert status == 200 and events[-1] == "[DONE]", (status, events[-3:])
usage = json.loads(events[-2])
assert usage["choices"] == [] and usage["usage"] == plain["usage"], (usage, plain)
pieces = [json.loads(e) for e in events[:-2]]  # how the text is cut into events is the stream's timing
assert all(p["choices"] for p in pieces) and "".join(p["choices"][0]["text"] for p in pieces) == plain["choices"][0]["text"], pieces
status, body = call("POST", "/v1/completions", {"prompt": "The ", "max_tokens": 12, "temperature": 0, "stop": " "})
assert status == 200 and " " not in json.loads(body)["choices"][0]["text"], body
print(f"ok: /v1/completions, and streamed in {len(chunks)} events to the same text")

# Bad requests: 400 with the reason.
bad = [("PUT", "/api", {"tokens_to_generate": 3}, "prompts argument required"),
       ("PUT", "/api", {"prompts": "x"}, "prompts is not a list of strings"),
       ("PUT", "/api", {"prompts": ["x"], "top_p": 1}, "top_p must be a positive float"),
       ("PUT", "/api", {"prompts": ["x"], "top_p": 0.5, "top_k": 3}, "cannot set both"),
       ("PUT", "/api", {"prompts": ["x"], "tokens_to_generate": 0}, "implies logprobs"),
       ("PUT", "/api", {"prompts": [""]}, "Empty prompts require add_BOS"),
       ("PUT", "/api", {"prompts": ["x" * 40]}, "over the model's 32 positions"),
       ("PUT", "/api", {"prompts": ["x", "y"], "beam_width": 2}, "batch size must be 1"),
       ("PUT", "/api", "{not json", "not JSON"),
       ("POST", "/v1/completions", {"prompt": 3}, "prompt must be"),
       ("POST", "/v1/completions", {"prompt": "x", "n": 2}, "n must be 1"),
       ("POST", "/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "only allowed when stream")]
for method, path, body, reason in bad:
    status, text = call(method, path, body)
    assert status == 400 and reason in text, (body, status, text)
print(f"ok: {len(bad)} bad requests answered 400 with the reason")

status, text = call("GET", "/metrics", "")
assert status == 200, status
assert 'troupe_serve_requests_total{api="megatron",code="400"} 9' in text, text
assert 'troupe_serve_requests_total{api="completions",code="400"} 3' in text, text
assert "troupe_serve_request_seconds_count" in text and "troupe_serve_time_to_first_token_seconds_bucket" in text
print("ok: /metrics")
PY

# The page (GET /) in headless Chromium: it streams the completion into #out and ends "done" with the
# text the API gives.
if ! command -v chromium > /dev/null; then
  echo "skipped: no chromium (the page was not opened in a browser)"
else
  python3 -c 'import http.client,json,sys; c=http.client.HTTPConnection("127.0.0.1", int(sys.argv[1])); c.request("POST", "/v1/completions", json.dumps({"prompt": "The ", "max_tokens": 10, "temperature": 0})); print(json.loads(c.getresponse().read())["choices"][0]["text"], end="")' "$port" > want_page.txt
  # Headless Chromium's virtual time jumps past a streamed body's pauses; the page (autorun) keeps a
  # 5 ms timer ticking while it streams, so a budget of 600 s virtual is some 120,000 ticks of real
  # work; a run that still dumps the page "running" is repeated, up to 6.
  for attempt in 1 2 3 4 5 6; do
    rm -rf "$work/chrome"
    timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$work/chrome" \
      --virtual-time-budget=600000 --dump-dom "http://127.0.0.1:$port/?prompt=The%20&max_tokens=10&temperature=0&autorun=1" \
      > page.html 2> chromium.err || { tail chromium.err; fail "chromium failed"; }
    grep -q 'data-state="running"' page.html || break
  done
  python3 - page.html want_page.txt <<'PY' || { head -c 3000 page.html; fail "the page did not stream the completion"; }
import html.parser, sys
class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.depth, self.state, self.text = 0, None, ""
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id") == "out":
            self.depth, self.state = 1, a.get("data-state")
        elif self.depth:
            self.depth += 1
    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1
    def handle_data(self, data):
        if self.depth:
            self.text += data
p = Page()
p.feed(open(sys.argv[1]).read())
want = "The " + open(sys.argv[2]).read()
assert p.state == "done", p.state
assert p.text == want, (p.text, want)
print(f"ok: the page streamed {len(want) - 4} characters of completion in Chromium, the API's text")
PY
fi
stop_server

# A bearer token: required when set; beyond loopback without one: refused. This server decodes on
# tp 3 x pp 2 shard actors: greedy and 8 concurrent seeded clients get the one-decoder server's tokens.
"$troupe" launch --new-token > token.txt
start_server serve_token.log --token-file token.txt --tensor-model-parallel-size 3 --pipeline-model-parallel-size 2
python3 - "$port" token.txt <<'PY' || fail "the token is not enforced"
import http.client, json, sys
port, token = int(sys.argv[1]), open(sys.argv[2]).read().strip()
def call(headers, body={"prompts": ["a"], "tokens_to_generate": 2}):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("PUT", "/api", json.dumps(body), headers)
    r = c.getresponse()
    data = r.read()
    return r.status, data
assert call({})[0] == 401
assert call({"Authorization": "Bearer wrong"})[0] == 401
assert call({"Authorization": "Bearer " + token})[0] == 200
print("ok: the bearer token is required")
PY
answers_as_one_decoder "tp 3 x pp 2" token.txt || fail "tp 3 x pp 2 changed tokens"
stop_server

# The ranks as processes: troupe launch --nproc-per-node 3 -- serve on tp 3 (rank 0 serves, UCX between
# them) answers as the one-decoder server does; a rank killed ends the whole job (exit 1), no process left.
start_command serve_mp.log "$troupe" launch --nproc-per-node 3 -- serve --load ck --port 0 --num-threads 1 \
  --tensor-model-parallel-size 3
answers_as_one_decoder "tp 3 as 3 processes" || fail "the server on 3 processes gave other tokens"
ranks=$(pgrep -P "$serve_pid" || true)
[[ $(wc -w <<< "$ranks") == 3 ]] || fail "troupe launch runs $(wc -w <<< "$ranks") ranks, not 3"
victim=$(for p in $ranks; do tr '\0' '\n' < "/proc/$p/environ" | grep -qx TROUPE_RANK=2 && echo "$p"; done)
kill -9 "$victim"
set +e
timeout 30 tail --pid="$serve_pid" -f /dev/null
wait "$serve_pid"
rc=$?
set -e
serve_pid=""
[[ $rc == 1 ]] || { cat serve_mp.log; fail "killing rank 2 ended the job with exit $rc, not 1"; }
for p in $ranks; do ! kill -0 "$p" 2> /dev/null || fail "rank process $p outlived the job"; done
grep -q "rank 2 (pid $victim) was killed by signal 9" serve_mp.log || { cat serve_mp.log; fail "the launcher did not name rank 2"; }
echo "ok: a rank of the 3-process server killed: the job ended (exit 1), naming it, no process left"
set +e
"$troupe" serve --load ck --bind 0.0.0.0 --port 0 > open.log 2>&1
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "needs a bearer token\|requests need a bearer token" open.log || { cat open.log; fail "binding beyond loopback without a token was not refused"; }
echo "PASS: troupe serve answers Megatron's and OpenAI-style requests as troupe generate does"
