// model/generation.hpp.
#include "model/generation.hpp"

#include <algorithm>
#include <chrono>
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

namespace {

// What is wrong with one prompt and its options, each problem with its fix (`which`: "prompt 2").
void check_request(const std::vector<int32_t>& prompt, const GenerationOptions& options, const GptConfig& m,
                   const std::string& which, std::vector<std::string>& problems) {
  if (prompt.empty()) {
    problems.push_back(which + " is empty -- give it some text (at least one token)");
    return;
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.tokens_to_generate;
  if (total > m.max_position_embeddings)
    problems.push_back(fmt::format("{} is {} tokens, and with {} to generate {} is over the model's {} positions "
                                   "-- shorten it or lower --tokens-to-generate",
                                   which, prompt.size(), options.tokens_to_generate, total, m.max_position_embeddings));
}

Status problems_status(const std::vector<std::string>& problems) {
  if (problems.empty()) return Status::ok();
  std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} problems:", problems.size());
  if (problems.size() > 1)
    for (const std::string& p : problems) message += "\n  - " + p;
  return Status::bad_input(message);
}

}  // namespace

BatchGenerator::~BatchGenerator() {
  for (Running& r : running_) decoder_.close_sequence(r.id);
}

Status BatchGenerator::add(Request r) {
  std::vector<std::string> problems = check_sampling(r.options.sampling);
  if (r.options.tokens_to_generate < 0)
    problems.push_back(fmt::format("--tokens-to-generate {} is negative -- give 0 or more", r.options.tokens_to_generate));
  check_request(r.prompt, r.options, decoder_.config(), fmt::format("prompt {}", r.index + 1), problems);
  TROUPE_RETURN_IF_ERROR(problems_status(problems));
  queued_.push_back(std::move(r));
  return Status::ok();
}

bool BatchGenerator::advance(Running& r) {
  const GenerationOptions& o = r.request.options;
  if (r.step >= o.tokens_to_generate) {
    r.out.finish_reason = "length";
    return false;
  }
  const int32_t token = sample_token(r.last, o.sampling, r.request.index, r.step);
  const double lp = token_log_prob(r.last, token);
  ++r.step;
  r.out.tokens.push_back(token);
  r.out.log_probs.push_back(lp);
  if (r.request.on_token) r.request.on_token(token, lp);
  if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), token) != o.stop_tokens.end()) {
    r.out.finish_reason = "stop token";
    return false;
  }
  if (o.stop && o.stop(static_cast<size_t>(r.request.index), r.out.tokens)) {
    r.out.finish_reason = "stop";
    return false;
  }
  if (r.step >= o.tokens_to_generate) {
    r.out.finish_reason = "length";
    return false;
  }
  return true;
}

Result<bool> BatchGenerator::step(Context& ctx) {
  if (queued_.empty() && running_.empty()) return false;
  const size_t V = static_cast<size_t>(decoder_.config().vocab_size);
  std::vector<Running> next;
  // The sequences that go on: the running ones after their sampled token, and the new ones.
  std::vector<int> ids;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<size_t> fed;  // into `next`
  auto finish = [&](Running& r) {
    decoder_.close_sequence(r.id);
    if (r.request.on_done) r.request.on_done(std::move(r.out));
  };
  for (Running& r : running_) {
    if (advance(r)) {
      ids.push_back(r.id);
      tokens.push_back({r.out.tokens.back()});
      fed.push_back(next.size());
      next.push_back(std::move(r));
    } else {
      finish(r);
    }
  }
  // New prompts join: their logits of every prompt row (the prompt's own log-probabilities).
  const size_t first_new = next.size();
  for (Request& q : queued_) {
    Running r;
    r.request = std::move(q);
    r.id = decoder_.open_sequence();
    ids.push_back(r.id);
    tokens.push_back(r.request.prompt);
    fed.push_back(next.size());
    next.push_back(std::move(r));
  }
  queued_.clear();
  running_.clear();
  if (!ids.empty()) {
    // One feed: the running sequences' last tokens (their logits only) and the new prompts (every
    // row when their own log-probabilities are wanted, else the last).
    std::vector<uint8_t> every(ids.size(), 0);
    for (size_t j = first_new; j < ids.size(); ++j) every[j] = next[fed[j]].request.options.prompt_log_probs ? 1 : 0;
    auto logits = decoder_.feed_each(ctx, ids, tokens, every);
    if (!logits) return logits.status();
    for (size_t j = 0; j < ids.size(); ++j) {
      Running& r = next[fed[j]];
      std::vector<float>& all = logits.value()[j];
      if (every[j]) {
        const size_t rows = r.request.prompt.size();
        for (size_t t = 0; t + 1 < rows; ++t) {
          const std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>(t * V),
                                       all.begin() + static_cast<std::ptrdiff_t>((t + 1) * V));
          r.out.prompt_log_probs.push_back(token_log_prob(row, r.request.prompt[t + 1]));
        }
        r.last.assign(all.end() - static_cast<std::ptrdiff_t>(V), all.end());
      } else {
        r.last = std::move(all);
      }
    }
  }
  running_ = std::move(next);
  // A new request with nothing to generate is done at once.
  std::vector<Running> still;
  for (Running& r : running_) {
    if (r.request.options.tokens_to_generate == 0) {
      r.out.finish_reason = "length";
      finish(r);
    } else {
      still.push_back(std::move(r));
    }
  }
  running_ = std::move(still);
  return true;
}

Result<std::vector<Generation>> generate(Context& ctx, SequenceDecoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerationOptions& options, GenerationTimes* times) {
  std::vector<std::string> problems = check_sampling(options.sampling);
  if (options.tokens_to_generate < 0)
    problems.push_back(fmt::format("--tokens-to-generate {} is negative -- give 0 or more", options.tokens_to_generate));
  if (prompts.empty()) problems.push_back("no prompt -- give --prompt TEXT or --prompts-file FILE");
  for (size_t i = 0; i < prompts.size(); ++i)
    check_request(prompts[i], options, decoder.config(), fmt::format("prompt {}", i + 1), problems);
  TROUPE_RETURN_IF_ERROR(problems_status(problems));
  std::vector<Generation> out(prompts.size());
  BatchGenerator batch(decoder);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BatchGenerator::Request r;
    r.prompt = prompts[i];
    r.options = options;
    r.index = static_cast<int64_t>(i);
    r.on_done = [&out, i](Generation g) { out[i] = std::move(g); };
    TROUPE_RETURN_IF_ERROR(batch.add(std::move(r)));
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (bool first = true;; first = false) {
    auto stepped = batch.step(ctx);
    if (!stepped) return stepped.status();
    if (first && times != nullptr) times->prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!stepped.value()) break;
  }
  if (times != nullptr) {
    times->decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count() - times->prefill_seconds;
    times->tokens = 0;
    for (const Generation& g : out) times->tokens += static_cast<int64_t>(g.tokens.size());
  }
  return out;
}

Result<std::vector<BeamHypothesis>> beam_search(Context& ctx, SequenceDecoder& decoder, const std::vector<int32_t>& prompt,
                                                int beam_width, int tokens_to_generate, int32_t stop_token,
                                                double length_penalty) {
  std::vector<std::string> problems;
  if (beam_width < 1) problems.push_back(fmt::format("--beam-width {} -- give 1 or more", beam_width));
  if (tokens_to_generate < 1)
    problems.push_back(fmt::format("--tokens-to-generate {} -- beam search generates 1 or more", tokens_to_generate));
  GenerationOptions o;
  o.tokens_to_generate = std::max(0, tokens_to_generate);
  check_request(prompt, o, decoder.config(), "the prompt", problems);
  TROUPE_RETURN_IF_ERROR(problems_status(problems));
  const size_t V = static_cast<size_t>(decoder.config().vocab_size);
  struct Beam {
    int id = -1;
    std::vector<int32_t> tokens;
    double score = 0;
    std::vector<float> logits;
  };
  std::vector<BeamHypothesis> hyps;  // the best beam_width, kept sorted best first
  auto add = [&](std::vector<int32_t> tokens, double sum, int64_t length) {
    const double score = sum / std::pow(static_cast<double>(length), length_penalty);
    if (static_cast<int>(hyps.size()) >= beam_width && score <= hyps.back().score) return;
    hyps.push_back({std::move(tokens), score});
    std::stable_sort(hyps.begin(), hyps.end(), [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });
    if (static_cast<int>(hyps.size()) > beam_width) hyps.pop_back();
  };
  std::vector<Beam> beams(1);
  beams[0].id = decoder.open_sequence();
  auto first = decoder.feed(ctx, {beams[0].id}, {prompt});
  if (!first) {
    decoder.close_sequence(beams[0].id);
    return first.status();
  }
  beams[0].logits = std::move(first.value()[0]);
  bool done = false;
  for (int step = 0; step < tokens_to_generate && !done; ++step) {
    // Candidates (score, beam, token), best first; ties: lower beam, then lower token.
    struct Cand {
      double score;
      size_t beam;
      int32_t token;
    };
    std::vector<Cand> cands;
    for (size_t b = 0; b < beams.size(); ++b) {
      const std::vector<float>& lg = beams[b].logits;
      double mx = -INFINITY, sum = 0;
      for (float v : lg) mx = std::max(mx, static_cast<double>(v));
      for (float v : lg) sum += std::exp(static_cast<double>(v) - mx);
      const double lse = mx + std::log(sum);
      for (size_t t = 0; t < V; ++t) cands.push_back({beams[b].score + static_cast<double>(lg[t]) - lse, b, static_cast<int32_t>(t)});
    }
    const size_t keep = std::min(cands.size(), static_cast<size_t>(2 * beam_width));
    std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(keep), cands.end(), [](const Cand& a, const Cand& b) {
      return a.score > b.score || (a.score == b.score && (a.beam < b.beam || (a.beam == b.beam && a.token < b.token)));
    });
    std::vector<Beam> next;
    for (size_t rank = 0; rank < keep && static_cast<int>(next.size()) < beam_width; ++rank) {
      const Cand& c = cands[rank];
      if (c.token == stop_token) {
        if (static_cast<int>(rank) < beam_width) add(beams[c.beam].tokens, c.score, step + 1);
        continue;
      }
      Beam n;
      n.id = decoder.copy_sequence(beams[c.beam].id);
      n.tokens = beams[c.beam].tokens;
      n.tokens.push_back(c.token);
      n.score = c.score;
      next.push_back(std::move(n));
    }
    for (Beam& b : beams) decoder.close_sequence(b.id);
    beams = std::move(next);
    if (beams.empty()) break;
    // Done when the hypotheses are full and no running beam could beat the worst of them.
    double best = -INFINITY;
    for (const Beam& b : beams) best = std::max(best, b.score);
    if (static_cast<int>(hyps.size()) >= beam_width &&
        hyps.back().score >= best / std::pow(static_cast<double>(step + 1), length_penalty))
      done = true;
    if (done || step + 1 == tokens_to_generate) break;
    std::vector<int> ids;
    std::vector<std::vector<int32_t>> feed;
    for (const Beam& b : beams) {
      ids.push_back(b.id);
      feed.push_back({b.tokens.back()});
    }
    auto logits = decoder.feed(ctx, ids, feed);
    if (!logits) {
      for (Beam& b : beams) decoder.close_sequence(b.id);
      return logits.status();
    }
    for (size_t b = 0; b < beams.size(); ++b) beams[b].logits = std::move(logits.value()[b]);
  }
  if (!done)
    for (const Beam& b : beams) add(b.tokens, b.score, static_cast<int64_t>(b.tokens.size()));
  for (Beam& b : beams) decoder.close_sequence(b.id);
  return hyps;
}

}  // namespace troupe
