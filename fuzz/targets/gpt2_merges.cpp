// GPT-2's vocab.bpe (--merge-file) loaded with a fixed encoder.json (fuzz/data/gpt2_tiny, the
// tokens of GPT-2's first 64 merges). Property: as gpt2_vocab's.
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::fuzz {

Status gpt2_merges(const uint8_t* data, size_t size) {
  const std::string merges =
      write_scratch("vocab.bpe", std::string_view(reinterpret_cast<const char*>(data), size));
  auto tok = make_gpt2_bpe_tokenizer(source_path("fuzz/data/gpt2_tiny/encoder.json"), merges);
  if (!tok) return tok.status();
  check_round_trip(**tok, "the then there in inter  rere\t\r\n ed 'll 've \xc3\xa9t\xc3\xa9");
  return Status::ok();
}

}  // namespace troupe::fuzz
