// Text generation over a Decoder (docs/SERVE.md): Megatron's sampling (megatron/text_generation/
// sampling.py) and its loop, every prompt its own sequence in the key/value cache, all of them fed
// together at each step.
//
// Sampling, per sequence and step: top_k 1 is greedy (the first largest logit); otherwise the logits
// are divided by the temperature, then top_k > 1 keeps the k largest (ties: the lower token ids), or
// else top_p in (0, 1] keeps the smallest set of the most probable tokens whose probability reaches
// top_p (the token that crosses it included); the token is drawn from the softmax of what is kept,
// in double precision, by one uniform number u(seed, prompt index, step) (a counter-based hash:
// the same seed gives the same tokens on any layout, batch and order). Log-probabilities are the
// log-softmax of the raw logits (no temperature) at the chosen token, as Megatron reports them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/decoder.hpp"

namespace troupe {

struct SamplingOptions {
  int top_k = 0;             // 1: greedy; > 1: the k most probable; 0: off
  double top_p = 0;          // (0, 1]: nucleus; 0: off (with top_k 0 and top_p 0: the whole softmax)
  double temperature = 1.0;  // > 0
  uint64_t seed = 0;
};

// What is wrong with the options (empty: nothing), each problem with its fix.
std::vector<std::string> check_sampling(const SamplingOptions& options);

// The token chosen from `logits` (the real vocabulary) for prompt `prompt` at step `step`.
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& options, int64_t prompt, int64_t step);
// log softmax(logits)[token], in double.
double token_log_prob(const std::vector<float>& logits, int32_t token);

struct GenerationOptions {
  SamplingOptions sampling;
  int tokens_to_generate = 64;
  std::vector<int32_t> stop_tokens;  // a generated token among them ends its sequence (and is kept)
  // Called after each generated token with the prompt's index and its generated tokens so far;
  // true ends that sequence (stop strings: the command decodes and looks).
  std::function<bool(size_t prompt, const std::vector<int32_t>& generated)> stop;
};

struct Generation {
  std::vector<int32_t> tokens;     // generated, the stop token included
  std::vector<double> log_probs;   // one per generated token
  std::vector<double> prompt_log_probs;  // of prompt tokens 1.. given the ones before (Megatron's)
  std::string finish_reason;       // "length", "stop token", "stop"
};

// Generates for every prompt (each non-empty, prompt + tokens_to_generate within the model's
// positions: bad input naming the prompt otherwise). Prompts share the decoder's batch: each step
// feeds every unfinished sequence its last token.
Result<std::vector<Generation>> generate(Context& ctx, Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options);

}  // namespace troupe
