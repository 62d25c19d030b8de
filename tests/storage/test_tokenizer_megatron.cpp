// The tokenizer types scripts name beside troupe's own: Megatron-LM's NullTokenizer (no files: N
// ids, EOD N - 1, text as decimal ids; megatron/core/tokenizers/text/libraries/null_tokenizer.py)
// and Megatron-DeepSpeed's HFTokenizer (megatron/tokenizer/tokenizer.py _HFTokenizer: AutoTokenizer,
// whose vocab_size leaves out added tokens past the model's vocabulary, where
// HuggingFaceTokenizer counts them, as len(AutoTokenizer)).
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "storage/tokenizer.hpp"
#include "tests/test_util.hpp"

using nlohmann::json;

namespace {

TEST_CASE("NullTokenizer: N ids, EOD N - 1, decimal text", "[tokenizer]") {
  auto tok = troupe::make_tokenizer("NullTokenizer", "", "", "500");
  REQUIRE(tok.is_ok());
  CHECK((*tok)->vocab_size() == 500);
  CHECK((*tok)->eod() == 499);
  CHECK((*tok)->name() == "NullTokenizer");
  CHECK((*tok)->encode("3 14 159") == std::vector<int32_t>{3, 14, 159});
  CHECK((*tok)->decode({3, 14, 159}) == "3 14 159");
  CHECK((*tok)->encode("") == std::vector<int32_t>{});
  // Words that are no id of the vocabulary (Megatron's int() would raise) become EOD.
  CHECK((*tok)->encode("7 x 500") == std::vector<int32_t>{7, 499, 499});
  CHECK((*tok)->decode({600}) == "\xEF\xBF\xBD");
  for (const char* bad : {"", "1", "ten", "-4", "3000000000"}) {
    INFO(bad);
    auto t = troupe::make_tokenizer("NullTokenizer", "", "", bad);
    REQUIRE_FALSE(t.is_ok());
    CHECK_THAT(t.status().message(), Catch::Contains("--vocab-size"));
  }
}

// A byte-level tokenizer.json whose vocabulary is the 256 bytes and "ab", with an added token past
// it ("<|eos|>", id 257, as LLaMA-3's specials lie past its 128000 tokens).
std::string tokenizer_json() {
  json vocab = json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  const json doc = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                    {"decoder", {{"type", "ByteLevel"}}},
                    {"added_tokens", {{{"id", 257}, {"content", "<|eos|>"}, {"special", true}}}}};
  return doc.dump();
}

TEST_CASE("HFTokenizer: HuggingFaceTokenizer's ids with AutoTokenizer's vocab_size", "[tokenizer]") {
  troupe::test::TempDir dir;
  std::ofstream(dir.str("tokenizer.json")) << tokenizer_json();
  std::ofstream(dir.str("tokenizer_config.json")) << R"({"eos_token": "<|eos|>"})";
  auto hf = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", dir.str());
  auto mds = troupe::make_tokenizer("HFTokenizer", "", "", dir.str());
  REQUIRE(hf.is_ok());
  REQUIRE(mds.is_ok());
  CHECK((*hf)->vocab_size() == 258);   // len(AutoTokenizer): the added token too
  CHECK((*mds)->vocab_size() == 257);  // AutoTokenizer.vocab_size: the model's vocabulary
  CHECK((*mds)->name() == "HFTokenizer");
  CHECK((*mds)->eod() == (*hf)->eod());
  for (const char* text : {"abab", "a b<|eos|>ab", "x"}) CHECK((*mds)->encode(text) == (*hf)->encode(text));
  CHECK((*mds)->decode({256}) == "ab");
  CHECK((*mds)->decode({257}) == "\xEF\xBF\xBD");  // outside its vocabulary
  // It needs the same file as HuggingFaceTokenizer.
  auto missing = troupe::make_tokenizer("HFTokenizer", "", "", "");
  REQUIRE_FALSE(missing.is_ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("HFTokenizer needs --tokenizer-model"));
}

}  // namespace
