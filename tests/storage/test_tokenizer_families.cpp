// The tokenizers of the other model families: GPTSentencePieceTokenizer and Llama2Tokenizer
// against Debian's python3-sentencepiece, HuggingFaceTokenizer (tokenizer.json in the LLaMA-3,
// BLOOM and GPT-2 layouts) against an independent BPE in Python
// (tests/storage/tokenizer_oracle.py), on Unicode-heavy text; round trips; hostile and unsupported
// files.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "storage/hf_regex.hpp"
#include "storage/tokenizer.hpp"
#include "tests/storage/tokenizer_fixture.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

const troupe::test::TokenizerFixture* fixture_or_skip_reason(std::string* reason) {
  const auto* f = troupe::test::tokenizer_fixture();
  if (f == nullptr)
    *reason = "/usr/bin/python3 lacks sentencepiece or regex (scripts/setup.sh installs them)";
  return f;
}

// Every text of the fixture encodes to the oracle's ids; eod and vocab_size are the oracle's.
void check_against_oracle(const troupe::test::TokenizerFixture& f, const std::string& name) {
  INFO(name);
  const json& want = f.expected.at(name);
  auto tok = troupe::make_tokenizer(troupe::test::TokenizerFixture::type_of(name), "", "",
                                    f.model_of(name));
  REQUIRE(tok.is_ok());
  CHECK((*tok)->vocab_size() == want.at("vocab_size").get<int64_t>());
  CHECK((*tok)->eod() == want.at("eod").get<int32_t>());
  CHECK((*tok)->name() == troupe::test::TokenizerFixture::type_of(name));
  size_t tokens = 0;
  for (size_t i = 0; i < f.texts.size(); ++i) {
    const std::string text = f.texts[i].get<std::string>();
    INFO("text " << i << ": " << json(text).dump());
    const std::vector<int32_t> ids = (*tok)->encode(text);
    CHECK(ids == want.at("ids")[i].get<std::vector<int32_t>>());
    tokens += ids.size();
    for (int32_t id : ids) REQUIRE((id >= 0 && id < (*tok)->vocab_size()));
    if (want.contains("decoded")) {
      // SentencePiece: decode is the library's decode_ids (its normaliser does not round-trip).
      CHECK((*tok)->decode(ids) == want.at("decoded")[i].get<std::string>());
    }
  }
  CHECK(tokens > f.texts.size() * 5);  // the texts are not trivially short
}

}  // namespace

TEST_CASE(
    "SentencePiece: ids, eod and vocab size equal python3-sentencepiece's (Megatron's wrappers)",
    "[tokenizer][sentencepiece]") {
  std::string why;
  const auto* f = fixture_or_skip_reason(&why);
  if (f == nullptr) TROUPE_SKIP(why);
  REQUIRE(f->ok);
  check_against_oracle(*f, "gptsp");   // unigram, no BOS
  check_against_oracle(*f, "llama2");  // BPE with byte_fallback and split digits, BOS first

  // Llama2Tokenizer is GPTSentencePieceTokenizer's ids after the BOS (same model file).
  auto gpt = troupe::make_tokenizer("GPTSentencePieceTokenizer", "", "", f->model_of("llama2"));
  auto llama = troupe::make_tokenizer("Llama2Tokenizer", "", "", f->model_of("llama2"));
  REQUIRE(gpt.is_ok());
  REQUIRE(llama.is_ok());
  const std::string text = f->texts[1].get<std::string>();
  std::vector<int32_t> a = (*gpt)->encode(text), b = (*llama)->encode(text);
  REQUIRE(b.size() == a.size() + 1);
  CHECK(std::equal(a.begin(), a.end(), b.begin() + 1));
  CHECK(b[0] != (*llama)->eod());
  // An id past the vocabulary (a padded row) decodes to U+FFFD around the rest.
  std::vector<int32_t> padded = a;
  padded.push_back(static_cast<int32_t>((*gpt)->vocab_size()) + 3);
  CHECK((*gpt)->decode(padded) == (*gpt)->decode(a) + "\xEF\xBF\xBD");
}

TEST_CASE(
    "HuggingFaceTokenizer: tokenizer.json (LLaMA-3, BLOOM, GPT-2 layouts) gives the independent "
    "BPE's ids",
    "[tokenizer][hf]") {
  std::string why;
  const auto* f = fixture_or_skip_reason(&why);
  if (f == nullptr) TROUPE_SKIP(why);
  REQUIRE(f->ok);
  for (const char* layout : {"llama3", "bloom", "gpt2"}) {
    check_against_oracle(*f, layout);
    // Byte-level: decode gives every text back exactly, after the template's BOS (LLaMA-3's).
    auto tok = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", f->model_of(layout));
    REQUIRE(tok.is_ok());
    const auto prefix = std::string(layout) == "llama3" ? 1u : 0u;
    for (const auto& t : f->texts) {
      std::vector<int32_t> ids = (*tok)->encode(t.get<std::string>());
      REQUIRE(ids.size() >= prefix);
      CHECK((*tok)->decode(std::vector<int32_t>(ids.begin() + prefix, ids.end())) ==
            t.get<std::string>());
    }
    // The file itself, not its folder, reads the same (tokenizer_config.json beside it).
    auto by_file = troupe::make_tokenizer("HuggingFaceTokenizer", "", "",
                                          f->model_of(layout) + "/tokenizer.json");
    REQUIRE(by_file.is_ok());
    CHECK((*by_file)->encode(f->texts[0].get<std::string>()) ==
          (*tok)->encode(f->texts[0].get<std::string>()));
  }
  // Invalid UTF-8 (no Python string holds it) still encodes to ids that decode back.
  auto tok = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", f->model_of("bloom"));
  REQUIRE(tok.is_ok());
  const std::string raw = "ok \xff\xfe bytes \xe2\x82 cut \xc3";
  CHECK((*tok)->decode((*tok)->encode(raw)) == raw);
}

// Merges apply one at a time, lowest rank then leftmost (tokenizers' Word::merge_all), not every
// occurrence of a pair at once (GPT-2's encoder.py): with "ab a" ranked before "a b", "abab" is
// [a b] -> [ab a b] -> [aba b], where encoder.py gives [ab ab].
TEST_CASE("HuggingFaceTokenizer: merges one pair at a time, as tokenizers does",
          "[tokenizer][hf]") {
  troupe::test::TempDir dir;
  json vocab = json::object();
  // The byte-level alphabet: printable Latin-1 spells itself, the rest U+0100 on (one id per byte).
  std::vector<std::string> alphabet;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
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
  vocab["aba"] = 257;
  vocab["<|eos|>"] = 258;
  json doc = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"ab a", "a b"}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", {{{"id", 258}, {"content", "<|eos|>"}, {"special", true}}}}};
  write_all(dir.str("tokenizer.json"), doc.dump());
  write_all(dir.str("tokenizer_config.json"), R"({"eos_token": "<|eos|>"})");
  auto tok = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", dir.str());
  REQUIRE(tok.is_ok());
  CHECK((*tok)->encode("abab") == std::vector<int32_t>{257, 'b'});
  CHECK((*tok)->encode("abab<|eos|>ab") == std::vector<int32_t>{257, 'b', 258, 256});
  CHECK((*tok)->eod() == 258);
  CHECK((*tok)->vocab_size() == 259);

  // ByteLevel's add_prefix_space: a space before every stretch that lacks one, also after an added
  // token (tokenizers applies it to each piece the added tokens leave).
  doc["pre_tokenizer"]["add_prefix_space"] = true;
  write_all(dir.str("tokenizer.json"), doc.dump());
  auto spaced = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", dir.str());
  REQUIRE(spaced.is_ok());
  CHECK((*spaced)->encode("ab<|eos|>ab") == std::vector<int32_t>{' ', 256, 258, ' ', 256});
  CHECK((*spaced)->encode(" ab") == std::vector<int32_t>{' ', 256});
  doc["pre_tokenizer"]["add_prefix_space"] = false;

  // ignore_merges (LLaMA-3's): a piece that is itself a token is that token, whatever the merges
  // would make of it; without it, the merges decide.
  doc["model"]["vocab"]["abab"] = 259;
  for (bool ignore : {false, true}) {
    doc["model"]["ignore_merges"] = ignore;
    write_all(dir.str("tokenizer.json"), doc.dump());
    auto t = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", dir.str());
    REQUIRE(t.is_ok());
    CHECK((*t)->encode("abab") ==
          (ignore ? std::vector<int32_t>{259} : std::vector<int32_t>{257, 'b'}));
    // " abab" (GPT-2's pattern keeps the space) is no token: BPE either way.
    CHECK((*t)->encode("ab abab") == std::vector<int32_t>{256, ' ', 257, 'b'});
  }
}

TEST_CASE("Regex: Oniguruma's nested classes and \\s become PCRE2's, other constructs are refused",
          "[tokenizer][hf]") {
  auto bloom = troupe::Regex::translate(" ?[^(\\s|[.,!?…。，、।۔،])]+");
  REQUIRE(bloom.is_ok());
  CHECK(*bloom == " ?[^(\\s\\x{85}|.,!?…。，、।۔،)]+");
  auto re = troupe::Regex::compile(" ?[^(\\s|[.,!?…。，、।۔،])]+", false);
  REQUIRE(re.is_ok());
  using Spans = std::vector<std::pair<size_t, size_t>>;
  // "ab, c(d)\u0085e": pieces "ab", " c", "d", "e" (U+0085 is White_Space, as in Oniguruma).
  CHECK(re->find_all("ab, c(d)\xC2\x85"
                     "e") == Spans{{0, 2}, {3, 5}, {6, 7}, {10, 11}});
  CHECK_THAT(troupe::Regex::translate("[a[^b]]").status().message(),
             Catch::Contains("negated class nested"));
  CHECK_THAT(troupe::Regex::translate("[a-z&&[^aeiou]]").status().message(),
             Catch::Contains("intersection"));
  CHECK_THAT(troupe::Regex::compile("(a", false).status().message(),
             Catch::Contains("PCRE2 cannot compile"));
  // A catastrophic pattern stops at the match limit instead of running for hours.
  auto slow = troupe::Regex::compile("(a+)+$", false);
  REQUIRE(slow.is_ok());
  CHECK(slow->find_all(std::string(40, 'a') + "!").size() <= 1);
}

TEST_CASE("HuggingFaceTokenizer: unsupported pieces are refused, all named in one message",
          "[tokenizer][hf]") {
  std::string why;
  const auto* f = fixture_or_skip_reason(&why);
  if (f == nullptr) TROUPE_SKIP(why);
  REQUIRE(f->ok);
  const json base = json::parse(read_all(f->model_of("llama3") + "/tokenizer.json"));
  troupe::test::TempDir dir;
  write_all(dir.str("tokenizer_config.json"),
            read_all(f->model_of("llama3") + "/tokenizer_config.json"));
  auto load = [&](const json& doc) {
    write_all(dir.str("tokenizer.json"), doc.dump());
    auto tok = troupe::make_tokenizer("HuggingFaceTokenizer", "", "", dir.str());
    REQUIRE_FALSE(tok.is_ok());
    CHECK(tok.status().is_bad_input());
    CHECK_THAT(tok.status().message(), Catch::Contains("--tokenizer-model"));
    return tok.status().message();
  };
  json d = base;
  d["normalizer"] = {{"type", "NFC"}};
  d["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  d["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}, {"individual_digits", true}});
  d["added_tokens"][0]["lstrip"] = true;
  d["post_processor"] = {{"type", "RobertaProcessing"}};
  const std::string all = load(d);
  for (const char* piece : {"normalizer \"NFC\"", "MergedWithPrevious", "comes after ByteLevel",
                            "lstrip", "RobertaProcessing"})
    CHECK_THAT(all, Catch::Contains(piece));
  d = base;
  d["model"]["type"] = "WordPiece";
  d["normalizer"] = {{"type", "BertNormalizer"}};
  CHECK_THAT(load(d), Catch::Contains("model.type is \"WordPiece\"") &&
                          Catch::Contains("\"BertNormalizer\""));
  d = base;
  d["model"]["type"] = "Unigram";
  CHECK_THAT(load(d), Catch::Contains("\"Unigram\""));
  d = base;
  d["model"]["byte_fallback"] = true;
  d["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  d["decoder"] = {{"type", "Metaspace"}};
  const std::string spm_like = load(d);
  for (const char* piece : {"byte_fallback", "\"Metaspace\"", "no ByteLevel step", "decoder"})
    CHECK_THAT(spm_like, Catch::Contains(piece));
  // Ids: a hole, a merge of unknown tokens, a non-integer, a BLOOM-incompatible regex.
  d = base;
  d["added_tokens"][1]["id"] = 100000;
  CHECK_THAT(load(d), Catch::Contains("not 0.."));
  d = base;
  d["model"]["merges"].push_back("zz\u0001 q");
  CHECK_THAT(load(d), Catch::Contains("merges \"zz\\u0001\" and \"q\""));
  d = base;
  d["model"]["vocab"]["!"] = "x";
  CHECK_THAT(load(d), Catch::Contains("model.vocab[\"!\"]"));
  d = base;
  d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[a[^b]]";
  CHECK_THAT(load(d), Catch::Contains("negated class nested"));
  // No eos_token beside it.
  write_all(dir.str("tokenizer_config.json"), "{}");
  CHECK_THAT(load(base), Catch::Contains("no eos_token"));
}

TEST_CASE(
    "Tokenizer model files: missing, empty, corrupt, oversized and non-regular files are bad input",
    "[tokenizer][sentencepiece][hf]") {
  troupe::test::TempDir dir;
  auto message = [&](const std::string& type, const std::string& model) {
    auto tok = troupe::make_tokenizer(type, "", "", model);
    REQUIRE_FALSE(tok.is_ok());
    CHECK(tok.status().is_bad_input());
    return tok.status().message();
  };
  for (const char* type :
       {"GPTSentencePieceTokenizer", "Llama2Tokenizer", "HuggingFaceTokenizer"}) {
    INFO(type);
    CHECK_THAT(message(type, ""), Catch::Contains("needs --tokenizer-model"));
    CHECK_THAT(message(type, dir.str("nope")), Catch::Contains("does not exist"));
    CHECK_THAT(message(type, "/dev/zero"), Catch::Contains("not a regular file"));
  }
  REQUIRE(::mkfifo(dir.str("fifo").c_str(), 0600) == 0);
  CHECK_THAT(message("Llama2Tokenizer", dir.str("fifo")), Catch::Contains("not a regular file"));
  write_all(dir.str("empty.model"), "");
  CHECK_THAT(message("Llama2Tokenizer", dir.str("empty.model")), Catch::Contains("empty"));
  // A sparse file past the bound: refused by its size, nothing read.
  { std::ofstream(dir.str("huge.model")); }
  REQUIRE(::truncate(dir.str("huge.model").c_str(), off_t{65} << 20) == 0);
  CHECK_THAT(message("GPTSentencePieceTokenizer", dir.str("huge.model")),
             Catch::Contains("more than"));
  std::mt19937 rng(3);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  write_all(dir.str("noise.model"), noise);
  CHECK_THAT(message("GPTSentencePieceTokenizer", dir.str("noise.model")),
             Catch::Contains("not a SentencePiece model"));
  write_all(dir.str("tokenizer.json"), "{\"model\": [1, 2");
  CHECK_THAT(message("HuggingFaceTokenizer", dir.str()), Catch::Contains("tokenizer.json"));

  std::string why;
  const auto* f = fixture_or_skip_reason(&why);
  if (f == nullptr) TROUPE_SKIP(why);
  REQUIRE(f->ok);
  // A real model cut short, or with bytes flipped, is refused or loads -- never a crash; one that
  // loads still encodes inside its vocabulary.
  const std::string model = read_all(f->model_of("llama2"));
  for (size_t cut : {size_t{1}, size_t{17}, model.size() / 3, model.size() - 1}) {
    write_all(dir.str("cut.model"), model.substr(0, cut));
    auto tok = troupe::make_tokenizer("Llama2Tokenizer", "", "", dir.str("cut.model"));
    if (!tok.is_ok()) {
      CHECK(tok.status().is_bad_input());
      CHECK_THAT(tok.status().message(), Catch::Contains("--tokenizer-model"));
    }
  }
  for (int trial = 0; trial < 50; ++trial) {
    std::string flipped = model;
    for (int k = 0; k < 8; ++k) flipped[rng() % flipped.size()] = static_cast<char>(rng());
    write_all(dir.str("flip.model"), flipped);
    auto tok = troupe::make_tokenizer("GPTSentencePieceTokenizer", "", "", dir.str("flip.model"));
    if (!tok.is_ok()) {
      CHECK(tok.status().is_bad_input());
      continue;
    }
    for (int32_t id : (*tok)->encode(f->texts[2].get<std::string>()))
      CHECK((id >= 0 && id < (*tok)->vocab_size()));
  }
}
