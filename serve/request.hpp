// The request bodies `troupe serve` reads (docs/SERVE.md), parsed and checked before anything runs:
// Megatron's text-generation server (`PUT /api`, megatron/inference/text_generation_server.py: the
// same fields, defaults and rules, its messages where it has them) and the OpenAI-style legacy
// completions (`POST /v1/completions`). Any bytes: a body that is not such a request is bad input
// with the reason (the server answers 400 with it); nothing here allocates beyond what the body
// holds (fuzz/targets/serve_request.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/generation.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct ServeRequest {
  enum class Api { megatron, completions } api = Api::megatron;
  std::vector<std::string> prompts;
  int tokens_to_generate = 64;
  bool logprobs = false;
  SamplingOptions sampling;
  bool seeded = false;  // a seed was given (random_seed, seed); otherwise the server picks one
  bool add_bos = false;
  bool stop_on_eol = false, stop_on_double_eol = false;
  bool has_stop_token = false;
  int32_t stop_token = 0;
  std::vector<std::string> stop;  // completions' "stop" strings
  bool stream = false;            // completions: server-sent events
  bool include_usage = false;     // completions: stream_options.include_usage (a usage chunk before [DONE])
  bool echo = false;              // completions: the prompt before the text
  std::string model;              // completions: echoed back
  int beam_width = 0;             // megatron: > 0: beam search (one prompt)
  double length_penalty = 1.0;    // megatron: beam search's length penalty
};

// Megatron's PUT /api body. Its limits: 1 to 128 prompts, tokens_to_generate >= 0 (0 needs
// logprobs), temperature in (0, 100], top_k in [0, 1000], top_p a float in [0, 1] and not with
// top_k, an empty prompt only with add_BOS, random_seed >= 0; beam_width >= 1 with one prompt (beam
// search), length_penalty a float.
Result<ServeRequest> parse_megatron_request(std::string_view body);
// The OpenAI-style completions body: prompt (a string or 1 to 128 strings), max_tokens (16),
// temperature (1; 0 is greedy), top_p (1: off), top_k (an extension; 0), stop (a string or up to 4),
// stream, logprobs (null or an integer 0..5: each token's own log-probability), echo, seed, n (1).
Result<ServeRequest> parse_completions_request(std::string_view body);

}  // namespace troupe
