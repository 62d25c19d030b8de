// model/generation.hpp.
#include "model/generation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace troupe {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) for (seed, prompt, step).
double uniform(uint64_t seed, int64_t prompt, int64_t step) {
  const uint64_t h = mix(mix(mix(seed) ^ static_cast<uint64_t>(prompt)) ^ static_cast<uint64_t>(step));
  return static_cast<double>(h >> 11) * 0x1p-53;
}

}  // namespace

std::vector<std::string> check_sampling(const SamplingOptions& o) {
  std::vector<std::string> problems;
  if (o.top_k < 0) problems.push_back(fmt::format("--top-k {} is negative -- give 0 (off), 1 (greedy) or k > 1", o.top_k));
  if (!(o.top_p >= 0 && o.top_p <= 1))
    problems.push_back(fmt::format("--top-p {} is outside (0, 1] -- give a probability mass such as 0.9, or 0 for off", o.top_p));
  if (o.top_k > 1 && o.top_p > 0)
    problems.push_back("--top-k and --top-p are both set -- give one of them (Megatron samples with one)");
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    problems.push_back(fmt::format("--temperature {} is not positive -- give a value such as 1.0 (0.0 is --top-k 1)",
                                   o.temperature));
  return problems;
}

double token_log_prob(const std::vector<float>& logits, int32_t token) {
  double mx = -INFINITY, sum = 0;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return static_cast<double>(logits[static_cast<size_t>(token)]) - mx - std::log(sum);
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, int64_t prompt, int64_t step) {
  const int64_t V = static_cast<int64_t>(logits.size());
  TROUPE_CHECK(V > 0, "sample_token: no logits");
  if (o.top_k == 1) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates, most probable first (ties: the lower id).
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t keep = order.size();
  if (o.top_k > 1) {
    keep = std::min(order.size(), static_cast<size_t>(o.top_k));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }
  std::vector<double> p(keep);
  const double mx = logits[order[0]] / o.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(logits[order[i]] / o.temperature - mx);
  if (o.top_p > 0 && o.top_k <= 1) {
    // The smallest prefix whose probability reaches top_p.
    double mass = 0;
    size_t n = 0;
    while (n < keep) {
      mass += p[n] / sum;
      ++n;
      if (mass >= o.top_p) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
  }
  const double u = uniform(o.seed, prompt, step) * sum;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

Result<std::vector<Generation>> generate(Context& ctx, Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options) {
  const GptConfig& m = decoder.config();
  std::vector<std::string> problems = check_sampling(options.sampling);
  if (options.tokens_to_generate < 0)
    problems.push_back(fmt::format("--tokens-to-generate {} is negative -- give 0 or more", options.tokens_to_generate));
  if (prompts.empty()) problems.push_back("no prompt -- give --prompt TEXT or --prompts-file FILE");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      problems.push_back(fmt::format("prompt {} is empty -- give it some text (at least one token)", i + 1));
      continue;
    }
    const int64_t total = static_cast<int64_t>(prompts[i].size()) + options.tokens_to_generate;
    if (total > m.max_position_embeddings)
      problems.push_back(fmt::format("prompt {} is {} tokens, and with {} to generate {} is over the model's {} positions "
                                     "-- shorten it or lower --tokens-to-generate",
                                     i + 1, prompts[i].size(), options.tokens_to_generate, total,
                                     m.max_position_embeddings));
  }
  if (!problems.empty()) {
    std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} problems:", problems.size());
    if (problems.size() > 1)
      for (const std::string& p : problems) message += "\n  - " + p;
    return Status::bad_input(message);
  }

  const size_t n = prompts.size();
  std::vector<Generation> out(n);
  std::vector<int> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = decoder.open_sequence();
  struct Closer {
    Decoder& d;
    std::vector<int>& ids;
    ~Closer() {
      for (int id : ids) d.close_sequence(id);
    }
  } closer{decoder, ids};
  // The prompts, all rows' logits: the prompt's own log-probabilities, and the first token's.
  auto first = decoder.feed(ctx, ids, prompts, /*every_token=*/true);
  if (!first) return first.status();
  const size_t V = static_cast<size_t>(m.vocab_size);
  std::vector<std::vector<float>> last(n);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<float>& all = first.value()[i];
    const size_t rows = prompts[i].size();
    for (size_t r = 0; r + 1 < rows; ++r) {
      const std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>(r * V),
                                   all.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
      out[i].prompt_log_probs.push_back(token_log_prob(row, prompts[i][r + 1]));
    }
    last[i].assign(all.end() - static_cast<std::ptrdiff_t>(V), all.end());
  }
  std::vector<size_t> active(n);
  std::iota(active.begin(), active.end(), 0);
  if (options.tokens_to_generate == 0)
    for (Generation& g : out) g.finish_reason = "length";
  for (int step = 0; step < options.tokens_to_generate && !active.empty(); ++step) {
    std::vector<size_t> next;
    std::vector<int> feed_ids;
    std::vector<std::vector<int32_t>> feed_tokens;
    for (size_t i : active) {
      const int32_t token = sample_token(last[i], options.sampling, static_cast<int64_t>(i), step);
      Generation& g = out[i];
      g.tokens.push_back(token);
      g.log_probs.push_back(token_log_prob(last[i], token));
      if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end()) {
        g.finish_reason = "stop token";
      } else if (options.stop && options.stop(i, g.tokens)) {
        g.finish_reason = "stop";
      } else if (step + 1 == options.tokens_to_generate) {
        g.finish_reason = "length";
      } else {
        next.push_back(i);
        feed_ids.push_back(ids[i]);
        feed_tokens.push_back({token});
      }
    }
    if (!next.empty()) {
      auto logits = decoder.feed(ctx, feed_ids, feed_tokens);
      if (!logits) return logits.status();
      for (size_t j = 0; j < next.size(); ++j) last[next[j]] = std::move(logits.value()[j]);
    }
    active = std::move(next);
  }
  return out;
}

}  // namespace troupe
