// GPTSentencePieceTokenizer and Llama2Tokenizer: a SentencePiece model through Debian's
// libsentencepiece, with the ids, special ids and vocabulary size of Megatron-LM's wrappers
// (megatron/training/tokenizer/tokenizer.py):
//
//   _GPTSentencePieceTokenizer  tokenize = encode_as_ids(text); eod = eos = eos_id();
//                               vocab_size = len(vocab) = the number of pieces.
//   _Llama2Tokenizer            tokenize(s, bos=True, eos=False) = [bos_id()] + encode(s);
//                               eod = eos_id(); vocab_size the same.
//
// The model file is read whole (at most kMaxModelBytes) and handed to the library as bytes, so a
// FIFO or a device planted at the path is refused before anything is read, and a corrupt file is
// the library's error (a Status, or an exception caught here), never a crash: tests/fuzz and
// fuzz/targets/sentencepiece_model.cpp feed it hostile bytes.
#include <sentencepiece_processor.h>

#include <exception>
#include <string_view>

#include "storage/durable.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

// LLaMA-2's tokenizer.model is 0.5 MB, Gemma's 256k-piece one 4 MB. A larger file is not a
// tokenizer model, and parsing it would only cost memory.
constexpr size_t kMaxModelBytes = size_t{64} << 20;

// Every kind of character a corpus has: ASCII, accents (composed and combining), CJK, Arabic, an
// emoji with a modifier, whitespace runs, and a byte that is not UTF-8.
constexpr std::string_view kProbeText =
    "The quick brown fox's 12345 tests! \xc3\xa9t\xc3\xa9 e\xcc\x81 \xe4\xb8\xad\xe6\x96\x87 "
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd  \t\n\xff end";

constexpr const char* kFix =
    "pass the SentencePiece model the data was (or is to be) tokenised with, e.g. LLaMA-2's "
    "tokenizer.model";

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(bool llama2) : llama2_(llama2) {}

  Status load(const std::string& path) {
    const std::string where = "--tokenizer-model '" + path + "': ";
    auto bytes = read_small_file(path, kMaxModelBytes);
    if (!bytes) return Status::bad_input(where + bytes.status().message() + " -- " + kFix);
    if (bytes->empty()) return Status::bad_input(where + "the file is empty -- " + kFix);
    // The library reports most corrupt files as a status, but some by throwing: an empty piece in a
    // unigram model throws Darts::Details::Exception from its trie builder (found by the fuzz
    // target sentencepiece_model; kept in fuzz/regressions/). The exception stops here.
    std::string error;
    try {
      const auto loaded = sp_.LoadFromSerializedProto(*bytes);
      if (!loaded.ok()) error = loaded.ToString();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty())
      return Status::bad_input(where + "not a SentencePiece model (libsentencepiece: " + error +
                               ") -- " + kFix);
    pieces_ = sp_.GetPieceSize();
    if (pieces_ <= 0) return Status::bad_input(where + "the model has no pieces -- " + kFix);
    // Megatron's eod is eos_id(); a model trained with --eos_id=-1 has none, and Megatron would
    // write -1 into the dataset. Likewise the BOS Llama2Tokenizer prepends.
    const int eos = sp_.eos_id(), bos = sp_.bos_id();
    std::string problems;
    if (eos < 0 || eos >= pieces_)
      problems += "it has no end-of-sentence piece (eos_id " + std::to_string(eos) +
                  "), which Megatron's " + name() + " uses as the end-of-document id; ";
    if (llama2_ && (bos < 0 || bos >= pieces_))
      problems += "it has no beginning-of-sentence piece (bos_id " + std::to_string(bos) +
                  "), which Llama2Tokenizer puts first in every sequence; ";
    if (!problems.empty()) {
      problems.resize(problems.size() - 2);
      return Status::bad_input(where + problems +
                               " -- use a model trained with eos (and bos) pieces" +
                               (llama2_ ? "" : ", or a tokenizer type that has them"));
    }
    eos_ = eos;
    bos_ = bos;
    // Some models load but cannot encode text: the normaliser keeps characters no piece consumes
    // (Encode: "all normalized characters are not consumed"; found by the fuzz target
    // sentencepiece_model, kept in fuzz/regressions/). Such a model is refused here, with a text
    // of every kind of character; encode() still never fails on other text (encode_each).
    std::vector<int> probe;
    if (const auto st = sp_.Encode(kProbeText, &probe); !st.ok())
      return Status::bad_input(where + "the model cannot encode text (libsentencepiece: " + st.ToString() + ") -- " +
                               kFix);
    return Status::ok();
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    // A loaded model encodes the probe text (load); should some other text still fail, it is
    // encoded one character at a time, a character that fails becoming unk.
    if (const auto st = sp_.Encode(text, &ids); !st.ok()) ids = encode_each(text);
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (llama2_) out.push_back(bos_);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  // decode_ids of each run of ids inside the vocabulary; an id outside it (a padded row) is U+FFFD,
  // where Python's decode_ids would raise.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out, piece;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      piece.clear();
      const auto st = sp_.Decode(run, &piece);
      TROUPE_CHECK(st.ok(),
                   "SentencePiece Decode failed on ids inside the vocabulary: " + st.ToString());
      out += piece;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id >= 0 && id < pieces_) {
        run.push_back(id);
      } else {
        flush();
        out += "\xEF\xBF\xBD";
      }
    }
    flush();
    return out;
  }

  int64_t vocab_size() const override { return pieces_; }

  // Character by character (a UTF-8 lead byte and its continuation bytes; a stray byte alone).
  std::vector<int> encode_each(std::string_view text) const {
    const int unk = sp_.unk_id() >= 0 && sp_.unk_id() < pieces_ ? sp_.unk_id() : eos_;
    std::vector<int> ids, one;
    for (size_t i = 0; i < text.size();) {
      size_t n = 1;
      while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80 && n < 4) ++n;
      one.clear();
      if (sp_.Encode(text.substr(i, n), &one).ok()) {
        ids.insert(ids.end(), one.begin(), one.end());
      } else {
        ids.push_back(unk);
      }
      i += n;
    }
    return ids;
  }
  int32_t eod() const override { return eos_; }
  std::string name() const override {
    return llama2_ ? "Llama2Tokenizer" : "GPTSentencePieceTokenizer";
  }

  SentencePieceSpecials specials() const {
    auto piece = [&](int id) { return id >= 0 && id < pieces_ ? sp_.IdToPiece(id) : std::string(); };
    return SentencePieceSpecials{piece(sp_.bos_id()), piece(sp_.eos_id()), piece(sp_.unk_id()), piece(sp_.pad_id())};
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool llama2_;
  int pieces_ = 0;
  int32_t eos_ = -1;
  int32_t bos_ = -1;
};

}  // namespace

Result<SentencePieceSpecials> sentencepiece_specials(const std::string& model_file) {
  SentencePieceTokenizer tok(false);
  TROUPE_RETURN_IF_ERROR(tok.load(model_file));
  return tok.specials();
}

Result<std::unique_ptr<Tokenizer>> make_sentencepiece_tokenizer(const std::string& model_file,
                                                                bool llama2) {
  auto tok = std::make_unique<SentencePieceTokenizer>(llama2);
  TROUPE_RETURN_IF_ERROR(tok->load(model_file));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace troupe
