// The SentencePiece models and tokenizer.json folders the tokenizer tests read, and their oracle's
// ids: made once per test process by tests/storage/tokenizer_oracle.py (python3-sentencepiece
// trains the models; a tiny byte-level BPE is trained in Python in the LLaMA-3, BLOOM and GPT-2
// layouts; an independent BPE encodes the texts). Nothing is cached in the repository.
#pragma once
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/test_util.hpp"

namespace troupe::test {

struct TokenizerFixture {
  TempDir dir;
  nlohmann::json texts;     // [text, ...]
  nlohmann::json expected;  // {name: {"ids": [[...], ...], "eod", "vocab_size"[, "decoded"]}}
  bool ok = false;

  std::string path(const std::string& name) const { return dir.str(name); }
  // The --tokenizer-type and --tokenizer-model of each fixture name.
  static const char* type_of(const std::string& name) {
    return name == "gptsp"    ? "GPTSentencePieceTokenizer"
           : name == "llama2" ? "Llama2Tokenizer"
                              : "HuggingFaceTokenizer";
  }
  std::string model_of(const std::string& name) const {
    return name == "gptsp"    ? path("unigram.model")
           : name == "llama2" ? path("bpe.model")
                              : path(name);
  }
};

// /usr/bin/python3 when it has Debian's sentencepiece and regex modules (scripts/setup.sh), else
// "".
inline std::string oracle_python() {
  const std::string py = "/usr/bin/python3";
  if (std::system((py + " -c 'import sentencepiece, regex' >/dev/null 2>&1").c_str()) == 0)
    return py;
  return "";
}

// The fixture, built on first use (about 10 s of CPU); null when the oracle's Python is absent.
inline const TokenizerFixture* tokenizer_fixture() {
  static const std::unique_ptr<TokenizerFixture> fixture =
      []() -> std::unique_ptr<TokenizerFixture> {
    const std::string py = oracle_python();
    if (py.empty()) return nullptr;
    auto f = std::make_unique<TokenizerFixture>();
    const std::string cmd = py + " '" + source_dir() + "/tests/storage/tokenizer_oracle.py' all '" +
                            f->dir.str() + "' 20261202";
    if (std::system(cmd.c_str()) != 0) return f;  // ok stays false: the test fails, saying so
    auto read = [](const std::string& p) {
      std::ifstream in(p, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      return nlohmann::json::parse(ss.str());
    };
    f->texts = read(f->path("texts.json"));
    f->expected = read(f->path("expected.json"));
    f->ok = true;
    return f;
  }();
  return fixture.get();
}

}  // namespace troupe::test
