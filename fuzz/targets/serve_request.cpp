// The request bodies troupe serve reads (serve/request.hpp): Megatron's PUT /api and OpenAI-style
// completions. Property: an accepted request is within the limits the parsers promise (1 to 128
// prompts, sampling options the generator takes, a stop list of at most 4).
#include "serve/request.hpp"
#include "fuzz/fuzz_targets.hpp"

namespace troupe::fuzz {

namespace {

void check_accepted(const ServeRequest& r) {
  TROUPE_CHECK(!r.prompts.empty() && r.prompts.size() <= 128, "an accepted request has 1 to 128 prompts");
  TROUPE_CHECK(r.tokens_to_generate >= 0 && r.tokens_to_generate <= (1 << 20), "tokens_to_generate out of range");
  TROUPE_CHECK(r.sampling.top_k >= 0 && r.sampling.top_k <= 1000, "top_k out of range");
  TROUPE_CHECK(r.sampling.top_p >= 0 && r.sampling.top_p <= 1, "top_p out of range");
  TROUPE_CHECK(r.sampling.temperature > 0 && r.sampling.temperature <= 100, "temperature out of range");
  TROUPE_CHECK(!(r.sampling.top_k > 1 && r.sampling.top_p > 0), "top_k and top_p both set");
  TROUPE_CHECK(r.stop.size() <= 4, "more than 4 stop strings");
}

}  // namespace

Status serve_request(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto megatron = parse_megatron_request(body);
  if (megatron) check_accepted(megatron.value());
  auto completions = parse_completions_request(body);
  if (completions) check_accepted(completions.value());
  return megatron ? megatron.status() : completions.status();
}

}  // namespace troupe::fuzz
