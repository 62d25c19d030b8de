#include "storage/tokenizer.hpp"

#include <charconv>

namespace troupe {
namespace {

// Megatron-LM's NullTokenizer (megatron/core/tokenizers/text/libraries/null_tokenizer.py): N ids,
// EOD N - 1 (its eod_id default), text = the ids in decimal, one space between.
class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {}

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find(' ', start);
      if (end == std::string_view::npos) end = text.size();
      const std::string_view word = text.substr(start, end - start);
      int64_t id = -1;
      const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
      const bool valid = ec == std::errc() && p == word.data() + word.size() && id >= 0 && id < vocab_size_;
      if (!word.empty() || end < text.size()) ids.push_back(valid ? static_cast<int32_t>(id) : eod());
      start = end + 1;
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ' ';
      out += ids[i] >= 0 && ids[i] < vocab_size_ ? std::to_string(ids[i]) : std::string("\xEF\xBF\xBD");
    }
    return out;
  }

  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_ - 1); }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_;
};

}  // namespace

bool tokenizer_uses_model(const std::string& type) {
  return type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer" || type == "HuggingFaceTokenizer" ||
         type == "HFTokenizer";
}

Result<std::unique_ptr<Tokenizer>> make_null_tokenizer(int64_t vocab_size) {
  if (vocab_size < 2 || vocab_size > 2147483647)
    return Status::bad_input("NullTokenizer's vocabulary of " + std::to_string(vocab_size) +
                             " tokens -- give --vocab-size from 2 to 2147483647");
  return std::unique_ptr<Tokenizer>(std::make_unique<NullTokenizer>(vocab_size));
}

Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& type,
                                                  const std::string& vocab_file,
                                                  const std::string& merge_file,
                                                  const std::string& tokenizer_model) {
  if (type == "ByteLevelTokenizer") return make_byte_tokenizer();
  if (type == "GPT2BPETokenizer") return make_gpt2_bpe_tokenizer(vocab_file, merge_file);
  if (tokenizer_uses_model(type) && tokenizer_model.empty())
    return Status::bad_input("--tokenizer-type " + type + " needs --tokenizer-model -- pass " +
                             (type == "HuggingFaceTokenizer" || type == "HFTokenizer"
                                  ? "the model's folder holding tokenizer.json (or the tokenizer.json itself)"
                                  : "the SentencePiece model file (e.g. LLaMA-2's tokenizer.model)"));
  if (type == "GPTSentencePieceTokenizer")
    return make_sentencepiece_tokenizer(tokenizer_model, false);
  if (type == "Llama2Tokenizer") return make_sentencepiece_tokenizer(tokenizer_model, true);
  if (type == "HuggingFaceTokenizer") return make_hf_tokenizer(tokenizer_model);
  if (type == "HFTokenizer") return make_hf_tokenizer(tokenizer_model, /*base_vocabulary=*/true);
  if (type == "NullTokenizer") {
    int64_t n = 0;
    const auto [p, ec] = std::from_chars(tokenizer_model.data(), tokenizer_model.data() + tokenizer_model.size(), n);
    if (tokenizer_model.empty() || ec != std::errc() || p != tokenizer_model.data() + tokenizer_model.size())
      return Status::bad_input(
          "--tokenizer-type NullTokenizer needs --vocab-size N, its vocabulary size (the "
          "config's tokenizer_model holds it: got '" +
          tokenizer_model + "')");
    return make_null_tokenizer(n);
  }
  return Status::bad_input("--tokenizer-type '" + type +
                           "' is not a known tokenizer -- use one of: " + kTokenizerTypes);
}

}  // namespace troupe
