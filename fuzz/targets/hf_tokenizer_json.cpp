// A Hugging Face tokenizer.json (HuggingFaceTokenizer's --tokenizer-model) and a text to encode
// with it: the input is split_two(tokenizer.json, text). The tokenizer_config.json beside it names
// as eos_token the last added token's content (or "<|endoftext|>"), so that files which load get
// past the eos look-up. Properties of a file that loads: every id lies in the vocabulary, the text
// comes back inside decode(encode(text)) (a template may add a BOS before it; add_prefix_space's
// spaces are not compared), and encoding twice gives the same ids (the piece cache must not change
// results).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::fuzz {

Status hf_tokenizer_json(const uint8_t* data, size_t size) {
  const auto [file, text] = split_two(data, size);
  std::string eos = "<|endoftext|>";
  {
    // Only a guess at the eos; the reader parses the file itself (bounded depth, no exceptions).
    const auto doc = nlohmann::json::parse(file, nullptr, false);
    if (doc.is_object() && doc.contains("added_tokens") && doc["added_tokens"].is_array() &&
        !doc["added_tokens"].empty()) {
      const auto& last = doc["added_tokens"].back();
      if (last.is_object() && last.contains("content") && last["content"].is_string())
        eos = last["content"].get<std::string>();
    }
  }
  const std::string config = nlohmann::json({{"eos_token", eos}})
                                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  auto tok = make_hf_tokenizer_from_text(std::string(file), config, "tokenizer.json");
  if (!tok) return tok.status();
  const std::vector<int32_t> ids = (*tok)->encode(text);
  for (int32_t id : ids)
    TROUPE_CHECK(id >= 0 && id < (*tok)->vocab_size(), "id outside the vocabulary");
  // ByteLevel's add_prefix_space puts a space before each piece: compare without spaces.
  auto spaceless = [](std::string s) {
    s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
    return s;
  };
  TROUPE_CHECK(
      spaceless((*tok)->decode(ids)).find(spaceless(std::string(text))) != std::string::npos,
      "decode(encode(x)) does not hold x");
  TROUPE_CHECK((*tok)->encode(text) == ids, "encoding twice gave different ids");
  TROUPE_CHECK((*tok)->eod() >= 0 && (*tok)->eod() < (*tok)->vocab_size(),
               "eod outside the vocabulary");
  return Status::ok();
}

}  // namespace troupe::fuzz
