// A Hugging Face config.json (parse_hf_config, storage/hf_import.hpp): what it accepts is a GPT-2,
// LLaMA or BLOOM troupe can build (positive sizes within int32, heads dividing the width or, for a
// LLaMA, key/value heads dividing the heads and an even head_dim (its own, or the width's share);
// the attention width within its bound; a positive epsilon).
#include <limits>

#include "fuzz/fuzz_targets.hpp"
#include "storage/hf_import.hpp"
#include "storage/hf_names.hpp"

namespace troupe::fuzz {

Status hf_config(const uint8_t* data, size_t size) {
  auto c = parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "config.json: ");
  if (!c) return c.status();
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {c->n_layer, c->n_embd, c->n_head, c->n_positions, c->vocab_size})
    TROUPE_CHECK(v >= 1 && v <= kMax, "accepted sizes are positive int32 values");
  const HfArch& a = c->arch;
  if (a.family == HfFamily::llama) {
    TROUPE_CHECK(a.groups >= 1 && a.heads % a.groups == 0, "accepted key/value heads divide the heads");
    TROUPE_CHECK(a.head_dim >= 2 && a.head_dim % 2 == 0 && a.heads * a.head_dim <= (int64_t{1} << 26),
                 "accepted head_dim is even and the attention width bounded");
  } else {
    TROUPE_CHECK(c->n_embd % c->n_head == 0, "accepted heads divide the width");
  }
  TROUPE_CHECK(a.layers == c->n_layer && a.hidden == c->n_embd && a.vocab == c->vocab_size,
               "the family's sizes are the config's");
  TROUPE_CHECK(c->layer_norm_epsilon > 0 && c->layer_norm_epsilon <= 1, "accepted epsilon in (0, 1]");
  return Status::ok();
}

}  // namespace troupe::fuzz
