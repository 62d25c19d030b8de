// A parallel decoder's feed as a rank in another process receives it from rank 0 (model/decode_work.hpp).
// Property: an accepted feed has its rows laid out from its token counts, tokens inside the
// vocabulary, micro-batches that cover it in order, and encodes back to the same bytes.
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "model/decode_work.hpp"

namespace troupe::fuzz {

Status decode_work(const uint8_t* data, size_t size) {
  constexpr int64_t kVocab = 50304;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto work = parse_decode_work(bytes, kVocab);
  if (!work) return work.status();
  const DecodeWork& w = work.value();
  TROUPE_CHECK(w.rows.ids.size() == w.tokens.size() && w.every.size() == w.tokens.size(), "one entry per sequence");
  int64_t row = 0;
  for (size_t i = 0; i < w.tokens.size(); ++i) {
    TROUPE_CHECK(!w.tokens[i].empty() && w.rows.row0[i] == row, "rows laid out from the token counts");
    for (int32_t t : w.tokens[i]) TROUPE_CHECK(t >= 0 && t < kVocab, "a token outside the vocabulary");
    row += static_cast<int64_t>(w.tokens[i].size());
  }
  TROUPE_CHECK(w.tokens.empty() ? w.group_end.empty() : w.group_end.back() == w.tokens.size(), "micro-batches cover the feed");
  TROUPE_CHECK(encode_decode_work(w) == bytes, "an accepted feed encodes back to its bytes");
  return Status::ok();
}

}  // namespace troupe::fuzz
