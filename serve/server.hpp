// troupe serve's HTTP server (docs/SERVE.md): Megatron's `PUT /api`, OpenAI-style
// `POST /v1/completions` (with `stream`: server-sent events), `GET /metrics` (Prometheus' text format)
// and `GET /` (a page to type prompts and watch the tokens stream, serve/page.cpp) over cpp-httplib. One generation thread owns the decoder and runs a BatchGenerator: requests from
// any number of connections join the running batch between decode steps (continuous batching), so
// a request's tokens are what `troupe generate` gives for it alone. A bearer token, when set, is
// required on every request (`Authorization: Bearer TOKEN`); the command refuses to listen beyond
// loopback without one.
#pragma once
#include <memory>
#include <string>

#include "model/decoder.hpp"
#include "storage/tokenizer.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 0;            // 0: a free port
  std::string token;       // empty: none required
  std::string model_name;  // what /v1/completions reports as "model"
  int threads = 1;         // the generation thread's compute threads
  int http_threads = 16;   // connections served at once (a streaming one holds one)
};

class InferenceServer {
 public:
  // Binds and starts serving (bad input when the address cannot be bound: in use, or not this host's).
  static Result<std::unique_ptr<InferenceServer>> start(std::unique_ptr<SequenceDecoder> decoder,
                                                        std::unique_ptr<Tokenizer> tokenizer, const ServeOptions& options);
  ~InferenceServer();
  int port() const;
  void stop();  // stops listening, ends the generation thread (running requests fail with 503)
  void wait();  // until stop() (from another thread or a signal handler's flag poller)

  struct Impl;

 private:
  explicit InferenceServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
