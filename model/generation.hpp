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
  // Generation::prompt_log_probs wanted: the head then runs on every prompt row, not only the last
  // (a long prompt's first token comes later).
  bool prompt_log_probs = true;
  // Called after each generated token with the prompt's index and its generated tokens so far;
  // true ends that sequence (stop strings: the command decodes and looks).
  std::function<bool(size_t prompt, const std::vector<int32_t>& generated)> stop;
};

struct Generation {
  std::vector<int32_t> tokens;     // generated, the stop token included
  std::vector<double> log_probs;   // one per generated token
  std::vector<double> prompt_log_probs;  // of prompt tokens 1.. given the ones before (Megatron's);
                                         // empty unless GenerationOptions::prompt_log_probs
  std::string finish_reason;       // "length", "stop token", "stop"
};

// Where generate's time went: the prompts fed (to the first tokens' logits) and the rest.
struct GenerationTimes {
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t tokens = 0;  // generated, all prompts
};

// Generates for every prompt (each non-empty, prompt + tokens_to_generate within the model's
// positions: bad input naming the prompt otherwise). Prompts share the decoder's batch: each step
// feeds every unfinished sequence its last token. (A BatchGenerator run until it is idle.)
Result<std::vector<Generation>> generate(Context& ctx, SequenceDecoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options, GenerationTimes* times = nullptr);

// Megatron's beam search (megatron/text_generation/generation.py, beam_search_and_return_on_first_stage):
// one prompt, `beam_width` beams; each step keeps the best beam_width continuations (beam score +
// log-probability) among the best 2 x beam_width, a continuation by `stop_token` ending a hypothesis
// (unless it ranks below beam_width) scored sum / length^length_penalty; done when beam_width
// hypotheses are in and none of the running beams could beat the worst; at the end the running
// beams join too. The hypotheses, best first (tokens generated, the stop token not among them).
struct BeamHypothesis {
  std::vector<int32_t> tokens;
  double score = 0;  // sum of log-probabilities / length^length_penalty
};
Result<std::vector<BeamHypothesis>> beam_search(Context& ctx, SequenceDecoder& decoder, const std::vector<int32_t>& prompt,
                                                int beam_width, int tokens_to_generate, int32_t stop_token,
                                                double length_penalty = 1.0);

// Continuous batching: requests join between decode steps. Each step first feeds the prompts of the
// requests added since the last one (all together, sampling their first tokens), then feeds every
// other running sequence its last token. A sequence's tokens depend only on its own prompt,
// options and index (the sampling draw's key), not on what else runs beside it.
class BatchGenerator {
 public:
  struct Request {
    std::vector<int32_t> prompt;
    GenerationOptions options;  // `stop` is called with `index` as the prompt
    int64_t index = 0;          // the sampling draw's prompt key (its place in its own request)
    // Called on the stepping thread: each generated token (with its log-probability), then once the
    // whole generation. Either may be empty.
    std::function<void(int32_t token, double log_prob)> on_token;
    std::function<void(Generation)> on_done;
  };
  explicit BatchGenerator(SequenceDecoder& decoder) : decoder_(decoder) {}
  ~BatchGenerator();  // closes the running sequences (their on_done is not called)
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;
  // Why `r` cannot run (empty prompt, too long, bad sampling options): bad input; else it is queued.
  Status add(Request r);
  // One step over the queued and running requests; false when there was nothing to do.
  Result<bool> step(Context& ctx);
  size_t running() const { return running_.size(); }
  size_t queued() const { return queued_.size(); }

 private:
  struct Running {
    Request request;
    int id = -1;  // the decoder's sequence
    Generation out;
    std::vector<float> last;  // the logits the next token is drawn from
    int64_t step = 0;
  };
  // Samples the next token of `r`; true when the sequence goes on.
  bool advance(Running& r);
  SequenceDecoder& decoder_;
  std::vector<Request> queued_;
  std::vector<Running> running_;
};

}  // namespace troupe
