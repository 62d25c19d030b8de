// GPT-2's encoder.json (--vocab-file) loaded with a fixed merge file
// (fuzz/data/gpt2_tiny/vocab.bpe, GPT-2's first 64 merges). Property: a vocabulary that loads
// round-trips text (decode(encode(x))
// == x) and encodes to ids inside it.
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::fuzz {

Status gpt2_vocab(const uint8_t* data, size_t size) {
  const std::string vocab =
      write_scratch("encoder.json", std::string_view(reinterpret_cast<const char*>(data), size));
  auto tok = make_gpt2_bpe_tokenizer(vocab, source_path("fuzz/data/gpt2_tiny/vocab.bpe"));
  if (!tok) return tok.status();
  check_round_trip(**tok,
                   "The quick brown fox's 12 tests\n\n  didn't\xff\xfe end \xe2\x80\x94 here.");
  return Status::ok();
}

}  // namespace troupe::fuzz
