#!/usr/bin/env python3
"""Load on a running `troupe serve` (bench/serve_load.sh): C clients at once, each sending R streamed
OpenAI-style completions (POST /v1/completions, "stream": true with stream_options.include_usage,
greedy, up to N tokens: the usage chunk counts them) one after the other. Measures, per request, the latency (request sent to the stream's end)
and the time to first token (to the first server-sent event that carries text), and over the run
the generated tokens per second (all clients' tokens / the wall time from the first request to the
last answer). Prints one JSON object.

  serve_load.py --port P --clients C --requests R --tokens N --prompt TEXT
"""
import argparse
import http.client
import json
import statistics
import threading
import time


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(port, prompt, tokens, client, index):
    body = json.dumps({"prompt": f"{prompt} ({client}.{index})", "max_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first, tokens_out = None, None
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode().removeprefix("data: ")
            if data == "[DONE]":
                continue
            j = json.loads(data)
            if j.get("usage"):
                tokens_out = j["usage"]["completion_tokens"]
            elif j["choices"][0]["text"] and first is None:
                first = time.perf_counter() - t0
    latency = time.perf_counter() - t0
    c.close()
    if tokens_out is None:
        raise RuntimeError("the stream ended without its usage chunk")
    return latency, first if first is not None else latency, tokens_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4, help="per client, one after the other")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", default="The history of the city begins in the early years of the settlement")
    a = ap.parse_args()
    results, errors = [], []
    lock = threading.Lock()

    def client(k):
        for i in range(a.requests):
            try:
                results_one = one_request(a.port, a.prompt, a.tokens, k, i)
                with lock:
                    results.append(results_one)
            except Exception as e:  # noqa: BLE001 -- reported, and the run fails
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, the first: {errors[0]}")
    lat = [r[0] for r in results]
    ttft = [r[1] for r in results]
    n = len(results)
    tokens = sum(r[2] for r in results)  # the usage chunks' completion tokens
    print(json.dumps({"clients": a.clients, "requests": n, "tokens": tokens, "wall_seconds": wall,
                      "tokens_per_second": tokens / wall, "requests_per_second": n / wall,
                      "latency_p50": percentile(lat, 50), "latency_p90": percentile(lat, 90),
                      "latency_p99": percentile(lat, 99), "ttft_p50": percentile(ttft, 50),
                      "ttft_p90": percentile(ttft, 90), "ttft_p99": percentile(ttft, 99),
                      "latency_mean": statistics.mean(lat)}))


if __name__ == "__main__":
    main()
