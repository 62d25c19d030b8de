#include "storage/tokenizer.hpp"

namespace troupe {

Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& type,
                                                  const std::string& vocab_file,
                                                  const std::string& merge_file) {
  if (type == "ByteLevelTokenizer") return make_byte_tokenizer();
  if (type == "GPT2BPETokenizer") return make_gpt2_bpe_tokenizer(vocab_file, merge_file);
  return Status::bad_input("--tokenizer-type '" + type +
                       "' is not a known tokenizer -- use one of: " + kTokenizerTypes);
}

}  // namespace troupe
