// A SentencePiece model file (GPTSentencePieceTokenizer's --tokenizer-model), loaded through
// libsentencepiece from the bytes given. Properties of a model that loads: a Unicode-heavy text
// encodes to ids inside the vocabulary, Llama2Tokenizer's ids are the same after its BOS, and
// decode of them (and of an id past the vocabulary) returns.
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::fuzz {

Status sentencepiece_model(const uint8_t* data, size_t size) {
  const std::string path =
      write_scratch("tokenizer.model", std::string_view(reinterpret_cast<const char*>(data), size));
  auto tok = make_sentencepiece_tokenizer(path, false);
  if (!tok) return tok.status();
  const std::string text =
      "The quick brown fox's 12345 tests \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd "
      "e\xcc\x81 "
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7  \t\n\xff end";
  std::vector<int32_t> ids = (*tok)->encode(text);
  for (int32_t id : ids)
    TROUPE_CHECK(id >= 0 && id < (*tok)->vocab_size(), "id outside the vocabulary");
  TROUPE_CHECK((*tok)->eod() >= 0 && (*tok)->eod() < (*tok)->vocab_size(),
               "eod outside the vocabulary");
  auto llama = make_sentencepiece_tokenizer(path, true);
  if (llama) {
    const std::vector<int32_t> with_bos = (*llama)->encode(text);
    TROUPE_CHECK(with_bos.size() == ids.size() + 1 &&
                     std::equal(ids.begin(), ids.end(), with_bos.begin() + 1),
                 "Llama2Tokenizer's ids are not the BOS and GPTSentencePieceTokenizer's");
  }
  ids.push_back(static_cast<int32_t>((*tok)->vocab_size()));
  (void)(*tok)->decode(ids);
  return Status::ok();
}

}  // namespace troupe::fuzz
