// The page troupe serve answers GET / with (docs/SERVE.md): type a prompt, watch the tokens stream from
// /v1/completions (server-sent events read from fetch's body). Static: it holds no data of the server;
// a token, when the server needs one, is read from the URL's fragment (#token=...) and sent as the
// bearer header. For automation (tests/cli/serve.sh in headless Chromium) the query presets the form
// (?prompt=...&max_tokens=...&temperature=...&autorun=1); #out carries data-state="done" at the end.
#include "serve/page.hpp"

namespace troupe {

const std::string& serve_page() {
  static const std::string page = R"troupe_page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>troupe serve</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 56em; color: #222; }
textarea { width: 100%; height: 6em; font-family: inherit; font-size: 1em; }
label { margin-right: 1em; }
input[type=number] { width: 5em; }
#out { white-space: pre-wrap; background: #f6f6f4; border: 1px solid #ddd; padding: 1em; min-height: 4em; }
#out .prompt { color: #888; }
#status { color: #666; margin-top: .5em; }
</style>
</head>
<body>
<h1>troupe serve</h1>
<form id="form">
<textarea id="prompt" placeholder="Type a prompt">Once upon a time</textarea>
<p>
<label>tokens <input id="max_tokens" type="number" min="1" value="64"></label>
<label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.8"></label>
<label>top-p <input id="top_p" type="number" min="0.01" max="1" step="0.05" value="0.9"></label>
<button id="go" type="submit">Generate</button>
</p>
</form>
<div id="out" data-state="idle"></div>
<div id="status"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const token = (new URLSearchParams(location.hash.slice(1))).get("token");
const query = new URLSearchParams(location.search);
for (const k of ["prompt", "max_tokens", "temperature", "top_p"]) if (query.has(k)) $(k).value = query.get(k);

async function generate() {
  const out = $("out"), status = $("status");
  out.textContent = "";
  const shown = document.createElement("span");
  shown.className = "prompt";
  shown.textContent = $("prompt").value;
  out.appendChild(shown);
  const text = document.createTextNode("");
  out.appendChild(text);
  out.dataset.state = "running";
  $("go").disabled = true;
  const started = performance.now();
  let pieces = 0, first = 0;
  try {
    const headers = {"Content-Type": "application/json"};
    if (token) headers["Authorization"] = "Bearer " + token;
    const body = {prompt: $("prompt").value, max_tokens: Number($("max_tokens").value),
                  temperature: Number($("temperature").value), stream: true};
    const top_p = Number($("top_p").value);
    if (top_p > 0 && top_p < 1 && body.temperature > 0) body.top_p = top_p;
    const res = await fetch("/v1/completions", {method: "POST", headers, body: JSON.stringify(body)});
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || ("HTTP " + res.status));
    }
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buffer = "", done = false;
    while (!done) {
      const chunk = await reader.read();
      if (chunk.done) break;
      buffer += decoder.decode(chunk.value, {stream: true});
      let at;
      while ((at = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, at);
        buffer = buffer.slice(at + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") { done = true; break; }
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const piece = j.choices[0].text;
        if (piece) {
          if (!first) first = performance.now();
          text.appendData(piece);
          ++pieces;
        }
      }
    }
    const seconds = (performance.now() - started) / 1000;
    status.textContent = `${pieces} pieces in ${seconds.toFixed(2)} s` +
        (first ? `, first after ${((first - started) / 1000).toFixed(2)} s` : "");
    out.dataset.state = "done";
  } catch (e) {
    status.textContent = "error: " + e.message;
    out.dataset.state = "error";
  } finally {
    $("go").disabled = false;
  }
}
$("form").addEventListener("submit", (e) => { e.preventDefault(); generate(); });
if (query.get("autorun") === "1") {
  // Headless browsers with virtual time jump it past idle gaps (a streamed body's pauses): a timer
  // ticking until the text is in keeps virtual time to a pace the stream can follow.
  const tick = setInterval(() => {}, 5);
  generate().finally(() => clearInterval(tick));
}
</script>
</body>
</html>
)troupe_page";
  return page;
}

}  // namespace troupe
