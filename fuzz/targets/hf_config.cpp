// A Hugging Face config.json (parse_hf_config, storage/hf_import.hpp): what it accepts is a GPT-2
// troupe can build (positive sizes within int32, heads dividing the width, a positive epsilon).
#include <limits>

#include "fuzz/fuzz_targets.hpp"
#include "storage/hf_import.hpp"

namespace troupe::fuzz {

Status hf_config(const uint8_t* data, size_t size) {
  auto c = parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "config.json: ");
  if (!c) return c.status();
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {c->n_layer, c->n_embd, c->n_head, c->n_positions, c->vocab_size})
    TROUPE_CHECK(v >= 1 && v <= kMax, "accepted sizes are positive int32 values");
  TROUPE_CHECK(c->n_embd % c->n_head == 0, "accepted heads divide the width");
  TROUPE_CHECK(c->layer_norm_epsilon > 0 && c->layer_norm_epsilon <= 1, "accepted epsilon in (0, 1]");
  return Status::ok();
}

}  // namespace troupe::fuzz
