// `troupe preprocess` (storage/preprocess.hpp): formats, Megatron semantics, errors that write
// nothing, and byte compatibility checked by an independent Python reader
// (megatron_format_check.py).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "storage/indexed_dataset.hpp"
#include "storage/preprocess.hpp"
#include "storage/tokenizer.hpp"
#include "tests/storage/tokenizer_fixture.hpp"
#include "tests/test_util.hpp"

namespace fs = std::filesystem;
using troupe::PreprocessOptions;

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

PreprocessOptions byte_options(const troupe::test::TempDir& dir, const std::string& input) {
  PreprocessOptions o;
  o.input = dir.str(input);
  o.output_prefix = dir.str("out");
  o.tokenizer_type = "ByteLevelTokenizer";
  return o;
}

troupe::Result<troupe::PreprocessSummary> run(const PreprocessOptions& o) {
  return troupe::run_preprocess(o, [](const troupe::PreprocessProgress&) {});
}

// The documents of a dataset as token lists.
std::vector<std::vector<int32_t>> documents(const std::string& prefix) {
  auto ds = troupe::IndexedDataset::open(prefix);
  REQUIRE(ds.is_ok());
  std::vector<std::vector<int32_t>> docs;
  for (int64_t d = 0; d < (*ds)->num_documents(); ++d) {
    int64_t b = (*ds)->document_token_offset(d), e = (*ds)->document_token_offset(d + 1);
    std::vector<int32_t> t(static_cast<size_t>(e - b));
    (*ds)->read_tokens(b, e - b, t.data());
    docs.push_back(t);
  }
  return docs;
}

std::vector<int32_t> bytes_of(const std::string& s, bool eod) {
  std::vector<int32_t> v;
  for (char c : s) v.push_back(static_cast<unsigned char>(c));
  if (eod) v.push_back(256);
  return v;
}

using Docs = std::vector<std::vector<int32_t>>;

size_t files_in(const troupe::test::TempDir& dir) {
  return static_cast<size_t>(
      std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()));
}

std::string python_with_numpy() {
  for (std::string py : {"python3", "/usr/bin/python3"}) {
    if (std::system((py + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) return py;
  }
  return "";
}

}  // namespace

// Megatron keeps a document that tokenises to nothing as a document of no sequences (even with
// --append-eod, which ends only documents that have tokens), so that the .idx is Megatron's.
TEST_CASE("preprocess: JSONL, several keys, --append-eod, empty documents kept as Megatron keeps them",
          "[preprocess]") {
  troupe::test::TempDir dir;
  write_file(dir.str("in.jsonl"),
             "{\"text\": \"hello\", \"title\": \"A\"}\n"
             "{\"text\": \"\", \"title\": \"B\", \"n\": 3}\n"
             "\n"
             "{\"title\": \"C\", \"text\": \"w\\u00f6rld\\n\"}");  // no final newline
  PreprocessOptions o = byte_options(dir, "in.jsonl");
  o.json_keys = {"text", "title"};
  o.append_eod = true;
  auto s = run(o);
  REQUIRE(s.is_ok());
  CHECK(s->format == "jsonl");
  CHECK(s->records == 3);
  REQUIRE(s->outputs.size() == 2);
  CHECK(s->outputs[0].prefix == dir.str("out_text_document"));
  CHECK(s->outputs[0].documents == 3);
  CHECK(s->outputs[0].sequences == 2);
  CHECK(s->outputs[0].tokens == 6 + 8);
  CHECK(s->outputs[1].documents == 3);
  CHECK(s->outputs[0].dtype == troupe::IndexDType::u16);
  CHECK(documents(dir.str("out_text_document")) ==
        Docs{bytes_of("hello", true), {}, bytes_of("w\xC3\xB6rld\n", true)});
  {
    auto ds = troupe::IndexedDataset::open(dir.str("out_text_document"));
    REQUIRE(ds.is_ok());
    CHECK((*ds)->doc_indices() == std::vector<int64_t>{0, 1, 1, 2});
  }
  CHECK(documents(dir.str("out_title_document")) ==
        Docs{bytes_of("A", true), bytes_of("B", true), bytes_of("C", true)});

  o.append_eod = false;
  o.json_keys = {"text"};
  REQUIRE(run(o).is_ok());
  CHECK(documents(dir.str("out_text_document")) ==
        Docs{bytes_of("hello", false), {}, bytes_of("w\xC3\xB6rld\n", false)});
}

TEST_CASE("preprocess: text input, blank lines or a separator line end documents", "[preprocess]") {
  troupe::test::TempDir dir;
  write_file(dir.str("blank.txt"), "\n\npara one\nline two\n\n \n\npara two\n  \t\nthird");
  PreprocessOptions o = byte_options(dir, "blank.txt");
  auto s = run(o);
  REQUIRE(s.is_ok());
  CHECK(s->format == "text");
  CHECK(documents(dir.str("out_text_document")) == Docs{bytes_of("para one\nline two\n", false),
                                                        bytes_of("para two\n", false),
                                                        bytes_of("third", false)});

  write_file(dir.str("fortunes.txt"), "a\n%\nb\n\nc\n%\n%\nd\r\n%\r\n");
  o = byte_options(dir, "fortunes.txt");
  o.text_separator = "%";
  o.append_eod = true;
  s = run(o);
  REQUIRE(s.is_ok());
  CHECK(s->records == 3);
  CHECK(documents(dir.str("out_text_document")) ==
        Docs{bytes_of("a\n", true), bytes_of("b\n\nc\n", true), bytes_of("d\r\n", true)});
}

TEST_CASE("preprocess: auto format detection", "[preprocess]") {
  troupe::test::TempDir dir;
  write_file(dir.str("a.jsonl"), "\n  {\"text\": \"x\"}\n");
  auto s = run(byte_options(dir, "a.jsonl"));
  REQUIRE(s.is_ok());
  CHECK(s->format == "jsonl");
  write_file(dir.str("b.txt"), "  plain {text}\n");
  s = run(byte_options(dir, "b.txt"));
  REQUIRE(s.is_ok());
  CHECK(s->format == "text");
  CHECK(documents(dir.str("out_text_document")) == Docs{bytes_of("  plain {text}\n", false)});
}

TEST_CASE("preprocess: bad input names the line and writes nothing", "[preprocess]") {
  troupe::test::TempDir dir;
  write_file(dir.str("good.jsonl"), "{\"text\": \"old\"}\n");
  REQUIRE(run(byte_options(dir, "good.jsonl")).is_ok());
  const std::string old_bin = read_file(dir.str("out_text_document.bin"));
  write_file(dir.str("bad.jsonl"), "");
  const size_t files_before = files_in(dir);  // good.jsonl, bad.jsonl and the two outputs

  auto expect_error = [&](const std::string& content, std::vector<std::string> parts) {
    write_file(dir.str("bad.jsonl"), content);
    PreprocessOptions o = byte_options(dir, "bad.jsonl");
    o.input_format = "jsonl";
    auto s = run(o);
    REQUIRE_FALSE(s.is_ok());
    INFO(s.status().message());
    for (const auto& p : parts) CHECK_THAT(s.status().message(), Catch::Contains(p));
    CHECK(s.status().is_bad_input());  // exit 2: the input must change
    CHECK_THAT(s.status().message(), Catch::Contains(" -- "));
    CHECK(files_in(dir) == files_before);  // no temporaries, no new outputs
    CHECK(read_file(dir.str("out_text_document.bin")) == old_bin);
  };
  expect_error("{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": \"c\"\n{\"text\": \"d\"}\n",
               {"line 3", "JSON", "bad.jsonl"});
  expect_error("{\"text\": \"a\"}\n\n{\"body\": \"b\"}\n",
               {"line 3", "'text'", "body", "--json-keys"});
  expect_error("{\"text\": 5}\n", {"line 1", "'text'", "string"});
  expect_error("[1, 2]\n", {"line 1", "object"});
  expect_error("{\"text\": \"\"}\n{\"text\": \"\"}\n", {"holds no tokens", "2 records"});
  // A number a double cannot hold is named with its key (it used to read as "not valid JSON").
  expect_error("{\"text\": \"a\"}\n{\"text\": \"b\", \"meta\": {\"score\": 1e400}}\n",
               {"line 2", "key \"meta.score\"", "1e400"});
}

TEST_CASE("preprocess: option errors", "[preprocess]") {
  troupe::test::TempDir dir;
  write_file(dir.str("in.txt"), "x\n");
  PreprocessOptions o = byte_options(dir, "in.txt");
  REQUIRE(troupe::validate_preprocess_options(o).is_ok());
  auto expect = [](PreprocessOptions bad, const std::string& flag) {
    troupe::Status st = troupe::validate_preprocess_options(bad);
    REQUIRE_FALSE(st.is_ok());
    CHECK_THAT(st.message(), Catch::Contains(flag));
  };
  PreprocessOptions bad = o;
  bad.input = dir.str("missing.txt");
  expect(bad, "--input");
  bad = o;
  bad.output_prefix = dir.str("no/such/dir/out");
  expect(bad, "--output-prefix");
  bad = o;
  bad.input_format = "csv";
  expect(bad, "--input-format");
  bad = o;
  bad.tokenizer_type = "Nope";
  expect(bad, "--tokenizer-type");
  bad = o;
  bad.tokenizer_type = "GPT2BPETokenizer";
  expect(bad, "--vocab-file");
  bad = o;
  bad.json_keys = {"a", "a"};
  expect(bad, "--json-keys");
  bad = o;
  bad.workers = 0;
  expect(bad, "--workers");
}

TEST_CASE("preprocess: output does not depend on --workers", "[preprocess]") {
  troupe::test::TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 5000; ++i) {
    jsonl += nlohmann::json({{"text", "document " + std::to_string(i) + std::string(i % 13, '!') +
                                          " caf\xC3\xA9"}})
                 .dump() +
             "\n";
  }
  write_file(dir.str("in.jsonl"), jsonl);
  const std::string gpt2 = troupe::test::source_dir() + "/.deps/gpt2";
  const bool bpe = fs::exists(gpt2 + "/encoder.json") && fs::exists(gpt2 + "/vocab.bpe");
  std::string bins[2], idxs[2];
  for (int w : {1, 4}) {
    PreprocessOptions o = byte_options(dir, "in.jsonl");
    if (bpe) {
      o.tokenizer_type = "GPT2BPETokenizer";
      o.vocab_file = gpt2 + "/encoder.json";
      o.merge_file = gpt2 + "/vocab.bpe";
    }
    o.workers = w;
    o.append_eod = true;
    o.output_prefix = dir.str("w" + std::to_string(w));
    REQUIRE(run(o).is_ok());
    bins[w == 4] = read_file(dir.str("w" + std::to_string(w) + "_text_document.bin"));
    idxs[w == 4] = read_file(dir.str("w" + std::to_string(w) + "_text_document.idx"));
  }
  CHECK(bins[0] == bins[1]);
  CHECK(idxs[0] == idxs[1]);
}

TEST_CASE("preprocess: output is readable by an independent Megatron-format reader (numpy)",
          "[preprocess]") {
  const std::string py = python_with_numpy();
  if (py.empty()) TROUPE_SKIP("python3 with numpy is absent");
  troupe::test::TempDir dir;
  const std::vector<std::string> texts = {"The quick brown fox.", "",
                                          "I'm here: 42 caf\xC3\xA9s \xE6\x97\xA5\xE6\x9C\xAC!\n",
                                          "  spaces  \n\n", "last one"};
  std::string jsonl;
  for (const auto& t : texts) jsonl += nlohmann::json({{"text", t}}).dump() + "\n";
  write_file(dir.str("in.jsonl"), jsonl);

  const std::string gpt2 = troupe::test::source_dir() + "/.deps/gpt2";
  std::vector<std::string> types = {"ByteLevelTokenizer"};
  if (fs::exists(gpt2 + "/encoder.json") && fs::exists(gpt2 + "/vocab.bpe"))
    types.push_back("GPT2BPETokenizer");
  for (const std::string& type : types) {
    INFO(type);
    PreprocessOptions o = byte_options(dir, "in.jsonl");
    o.tokenizer_type = type;
    o.vocab_file = gpt2 + "/encoder.json";
    o.merge_file = gpt2 + "/vocab.bpe";
    o.append_eod = true;
    o.output_prefix = dir.str(type);
    // Expected documents from the tokenizer alone, before preprocess runs.
    auto tok = troupe::make_tokenizer(type, o.vocab_file, o.merge_file);
    REQUIRE(tok.is_ok());
    nlohmann::json docs = nlohmann::json::array();
    for (const auto& t : texts) {
      std::vector<int32_t> ids = (*tok)->encode(t);
      if (!ids.empty()) ids.push_back((*tok)->eod());  // an empty document stays, without EOD
      docs.push_back(ids);
    }
    write_file(dir.str(type + ".expected.json"),
               nlohmann::json({{"dtype", "uint16"}, {"documents", docs}}).dump());
    REQUIRE(run(o).is_ok());
    const std::string cmd =
        py + " '" + troupe::test::source_dir() + "/tests/storage/megatron_format_check.py' '" +
        dir.str(type + "_text_document") + "' '" + dir.str(type + ".expected.json") + "'";
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

TEST_CASE("preprocess: .bin and .idx equal, byte for byte, an independent writer of Megatron's format",
          "[preprocess]") {
  const std::string py = python_with_numpy();
  if (py.empty()) TROUPE_SKIP("python3 with numpy is absent");
  troupe::test::TempDir dir;
  // Empty documents first, in the middle, in a row and last; odd sizes; non-ASCII.
  std::mt19937 rng(5);
  std::vector<std::string> texts = {"", "x", "", "", "caf\xC3\xA9 \xE6\x97\xA5", ""};
  for (int i = 0; i < 37; ++i) {
    std::string t(rng() % 3 == 0 ? 0 : 1 + rng() % 60, ' ');
    for (char& c : t) c = static_cast<char>('a' + rng() % 26);
    texts.insert(texts.begin() + static_cast<std::ptrdiff_t>(rng() % texts.size()), t);
  }
  texts.push_back("");
  std::string jsonl;
  for (const auto& t : texts) jsonl += nlohmann::json({{"body", t}, {"id", 1}}).dump() + "\n";
  write_file(dir.str("in.jsonl"), jsonl);
  for (bool eod : {true, false}) {
    INFO("append_eod " << eod);
    PreprocessOptions o = byte_options(dir, "in.jsonl");
    o.json_keys = {"body"};
    o.append_eod = eod;
    o.workers = 3;
    REQUIRE(run(o).is_ok());
    const std::string cmd = py + " '" + troupe::test::source_dir() + "/tests/storage/megatron_idx_writer.py' '" +
                            dir.str("in.jsonl") + "' body " + (eod ? "eod" : "noeod") + " '" + dir.str("megatron") + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string idx = read_file(dir.str("out_body_document.idx"));
    CHECK(idx.size() == read_file(dir.str("megatron.idx")).size());
    CHECK(idx == read_file(dir.str("megatron.idx")));
    CHECK(read_file(dir.str("out_body_document.bin")) == read_file(dir.str("megatron.bin")));
  }
}

TEST_CASE("preprocess: sentence splitting", "[preprocess]") {
  using troupe::split_sentences;
  using V = std::vector<std::string>;
  CHECK(split_sentences("One. Two!  Three?\nfour", false) == V{"One.", "Two!", "Three?\nfour"});
  CHECK(split_sentences("One. Two!  Three? Four", true) == V{"One. ", "Two!  ", "Three? ", "Four"});
  // Not boundaries: a lowercase continuation, an initial, an abbreviation, no space after.
  CHECK(split_sentences("See e.g. this. J. Smith met Dr. Who at 3.5 p.m. today.", false) ==
        V{"See e.g. this.", "J. Smith met Dr. Who at 3.5 p.m. today."});
  // Closing quotes and brackets stay with their sentence; runs of punctuation end once.
  CHECK(split_sentences("He said \"stop.\" Then (it ended!) Really?! Yes...", false) ==
        V{"He said \"stop.\"", "Then (it ended!)", "Really?!", "Yes..."});
  CHECK(split_sentences("", false).empty());
  CHECK(split_sentences("  lead. Tail  ", false) == V{"  lead.", "Tail  "});
  // With keep_newlines the sentences give back the text, for any text.
  std::mt19937 rng(11);
  const std::string alphabet = "ab. !?\n\"A)e";
  for (int i = 0; i < 300; ++i) {
    std::string t(rng() % 40, ' ');
    for (char& c : t) c = alphabet[rng() % alphabet.size()];
    std::string joined;
    for (const auto& s : split_sentences(t, true)) joined += s;
    CHECK(joined == t);
    for (const auto& s : split_sentences(t, false)) CHECK(!s.empty());
  }
}

TEST_CASE("preprocess: --split-sentences writes one sequence per sentence (PREFIX_{key}_sentence)",
          "[preprocess]") {
  troupe::test::TempDir dir;
  write_file(dir.str("in.jsonl"),
             "{\"text\": \"First one. Second one!\\nThird.\"}\n{\"text\": \"\"}\n{\"text\": \"Solo\"}\n");
  PreprocessOptions o = byte_options(dir, "in.jsonl");
  o.split_sentences = true;
  o.append_eod = true;
  auto s = run(o);
  REQUIRE(s.is_ok());
  CHECK(s->outputs[0].prefix == dir.str("out_text_sentence"));
  CHECK(s->outputs[0].documents == 3);
  CHECK(s->outputs[0].sequences == 4);
  auto ds = troupe::IndexedDataset::open(dir.str("out_text_sentence"));
  REQUIRE(ds.is_ok());
  CHECK((*ds)->doc_indices() == std::vector<int64_t>{0, 3, 3, 4});
  // EOD ends the last sentence of each document with tokens.
  CHECK((*ds)->sizes() == std::vector<int32_t>{10, 11, 6 + 1, 4 + 1});
  CHECK(documents(dir.str("out_text_sentence")) ==
        Docs{[] {
               auto v = bytes_of("First one.Second one!Third.", true);
               return v;
             }(),
             {},
             bytes_of("Solo", true)});
  // --keep-newlines keeps the whitespace after each sentence.
  o.keep_newlines = true;
  REQUIRE(run(o).is_ok());
  CHECK(documents(dir.str("out_text_sentence"))[0] == bytes_of("First one. Second one!\nThird.", true));
}

TEST_CASE("preprocess: --partitions does not change the output; --log-interval reports every N records",
          "[preprocess]") {
  troupe::test::TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 25; ++i) jsonl += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  write_file(dir.str("in.jsonl"), jsonl);
  PreprocessOptions o = byte_options(dir, "in.jsonl");
  REQUIRE(run(o).is_ok());
  const std::string idx = read_file(dir.str("out_text_document.idx"));
  o.partitions = 4;
  o.log_interval = 7;
  std::vector<int64_t> reported;
  auto s = troupe::run_preprocess(o, [&](const troupe::PreprocessProgress& p) { reported.push_back(p.documents); });
  REQUIRE(s.is_ok());
  CHECK(read_file(dir.str("out_text_document.idx")) == idx);
  CHECK(reported == std::vector<int64_t>{7, 14, 21});
  o.partitions = 0;
  CHECK_FALSE(run(o).is_ok());
}

// The model families' tokenizers: the dataset holds the oracle's ids (python3-sentencepiece, the
// independent byte-level BPE of tokenizer_oracle.py) with Megatron's --append-eod rule, read back
// by the independent reader; the same with 3 workers.
TEST_CASE("preprocess: SentencePiece and tokenizer.json datasets hold the oracle's ids", "[preprocess][tokenizer]") {
  const auto* f = troupe::test::tokenizer_fixture();
  if (f == nullptr) TROUPE_SKIP("/usr/bin/python3 lacks sentencepiece or regex (scripts/setup.sh installs them)");
  REQUIRE(f->ok);
  troupe::test::TempDir dir;
  std::string jsonl;
  for (const auto& t : f->texts) jsonl += nlohmann::json({{"text", t}}).dump() + "\n";
  write_file(dir.str("in.jsonl"), jsonl);
  for (const std::string name : {"gptsp", "llama2", "llama3", "bloom", "gpt2"}) {
    INFO(name);
    const nlohmann::json& want = f->expected.at(name);
    nlohmann::json docs = nlohmann::json::array();
    for (const auto& ids : want.at("ids")) {
      std::vector<int32_t> d = ids.get<std::vector<int32_t>>();
      if (!d.empty()) d.push_back(want.at("eod").get<int32_t>());  // Megatron ends only documents with tokens
      docs.push_back(d);
    }
    write_file(dir.str(name + ".expected.json"), nlohmann::json({{"dtype", "uint16"}, {"documents", docs}}).dump());
    for (int workers : {1, 3}) {
      PreprocessOptions o = byte_options(dir, "in.jsonl");
      o.tokenizer_type = troupe::test::TokenizerFixture::type_of(name);
      o.tokenizer_model = f->model_of(name);
      o.append_eod = true;
      o.workers = workers;
      o.output_prefix = dir.str(name + std::to_string(workers));
      auto s = run(o);
      REQUIRE(s.is_ok());
      const std::string cmd = "/usr/bin/python3 '" + troupe::test::source_dir() +
                              "/tests/storage/megatron_format_check.py' '" + dir.str(name + std::to_string(workers)) +
                              "_text_document' '" + dir.str(name + ".expected.json") + "'";
      CHECK(std::system(cmd.c_str()) == 0);
    }
  }
}
