#include "storage/tokenizer.hpp"

namespace troupe {

bool tokenizer_uses_model(const std::string& type) {
  return type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer" ||
         type == "HuggingFaceTokenizer";
}

Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& type,
                                                  const std::string& vocab_file,
                                                  const std::string& merge_file,
                                                  const std::string& tokenizer_model) {
  if (type == "ByteLevelTokenizer") return make_byte_tokenizer();
  if (type == "GPT2BPETokenizer") return make_gpt2_bpe_tokenizer(vocab_file, merge_file);
  if (tokenizer_uses_model(type) && tokenizer_model.empty())
    return Status::bad_input(
        "--tokenizer-type " + type + " needs --tokenizer-model -- pass " +
        (type == "HuggingFaceTokenizer"
             ? "the model's folder holding tokenizer.json (or the tokenizer.json itself)"
             : "the SentencePiece model file (e.g. LLaMA-2's tokenizer.model)"));
  if (type == "GPTSentencePieceTokenizer")
    return make_sentencepiece_tokenizer(tokenizer_model, false);
  if (type == "Llama2Tokenizer") return make_sentencepiece_tokenizer(tokenizer_model, true);
  if (type == "HuggingFaceTokenizer") return make_hf_tokenizer(tokenizer_model);
  return Status::bad_input("--tokenizer-type '" + type +
                           "' is not a known tokenizer -- use one of: " + kTokenizerTypes);
}

}  // namespace troupe
