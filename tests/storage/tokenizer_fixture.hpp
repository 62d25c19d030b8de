// The SentencePiece models and tokenizer.json folders the tokenizer tests read, and their oracle's
// ids, made by tests/storage/tokenizer_oracle.py (python3-sentencepiece trains the models; a tiny
// byte-level BPE is trained in Python in the LLaMA-3, BLOOM and GPT-2 layouts; an independent BPE
// encodes the texts). Nothing is cached in the repository: the files live in the system temp dir,
// in a folder named after a hash of the script, so that the test processes CTest starts (one per
// test case) make them once (about 10 s of CPU) and a changed script makes them anew.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/test_util.hpp"

namespace troupe::test {

struct TokenizerFixture {
  std::string root;
  nlohmann::json texts;     // [text, ...]
  nlohmann::json expected;  // {name: {"ids": [[...], ...], "eod", "vocab_size"[, "decoded"]}}
  bool ok = false;

  std::string path(const std::string& name) const { return root + "/" + name; }
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

// The fixture, built on first use; null when the oracle's Python is absent.
inline const TokenizerFixture* tokenizer_fixture() {
  static const std::unique_ptr<TokenizerFixture> fixture =
      []() -> std::unique_ptr<TokenizerFixture> {
    const std::string py = oracle_python();
    if (py.empty()) return nullptr;
    auto read = [](const std::string& p) {
      std::ifstream in(p, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    const std::string script = source_dir() + "/tests/storage/tokenizer_oracle.py";
    const std::string root =
        (std::filesystem::temp_directory_path() /
         ("troupe-tokenizer-fixture-" + std::to_string(std::hash<std::string>{}(read(script)))))
            .string();
    auto f = std::make_unique<TokenizerFixture>();
    f->root = root;
    std::error_code ec;
    if (!std::filesystem::exists(root + "/expected.json", ec)) {
      // Made aside and renamed into place: a process that finds the folder finds it whole (two
      // processes racing each make one; the second rename fails and its copy goes).
      TempDir scratch;
      const std::string made = scratch.str("made");
      const std::string cmd = py + " '" + script + "' all '" + made + "' 20261202";
      if (std::system(cmd.c_str()) != 0) return f;  // ok stays false: the tests fail, saying so
      std::filesystem::rename(made, root, ec);
      if (!std::filesystem::exists(root + "/expected.json", ec)) return f;
    }
    f->texts = nlohmann::json::parse(read(f->path("texts.json")), nullptr, false);
    f->expected = nlohmann::json::parse(read(f->path("expected.json")), nullptr, false);
    f->ok = f->texts.is_array() && f->expected.is_object();
    return f;
  }();
  return fixture.get();
}

}  // namespace troupe::test
