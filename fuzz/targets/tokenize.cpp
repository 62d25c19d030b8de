// The encode path on arbitrary bytes (what preprocess feeds it), for both tokenizers: the
// byte-level one and GPT-2 BPE with fuzz/data/gpt2_small (GPT-2's first 1000 merges and their
// tokens). Properties: every id lies in the vocabulary, decode(encode(x)) == x, and encoding is the
// same whether the text is encoded once or again (the piece cache must not change results).
#include <memory>
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::fuzz {

Status tokenize(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> bpe = [] {
    auto tok = make_gpt2_bpe_tokenizer(source_path("fuzz/data/gpt2_small/encoder.json"),
                                       source_path("fuzz/data/gpt2_small/vocab.bpe"));
    TROUPE_CHECK(tok.is_ok(), tok.status().message());
    return std::move(tok).value();
  }();
  static const std::unique_ptr<Tokenizer> bytes = make_byte_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_round_trip(*bytes, text);
  check_round_trip(*bpe, text);
  TROUPE_CHECK(bpe->encode(text) == bpe->encode(text), "encoding twice gave different ids");
  return Status::ok();
}

}  // namespace troupe::fuzz
