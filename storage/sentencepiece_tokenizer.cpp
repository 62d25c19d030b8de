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

#include "storage/durable.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

// LLaMA-2's tokenizer.model is 0.5 MB, Gemma's 256k-piece one 4 MB. A larger file is not a
// tokenizer model, and parsing it would only cost memory.
constexpr size_t kMaxModelBytes = size_t{64} << 20;

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
    return Status::ok();
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    // Encode fails only on a model not loaded; the ids of a loaded one cover any input (invalid
    // UTF-8 becomes U+FFFD in SentencePiece's normaliser).
    const auto st = sp_.Encode(text, &ids);
    TROUPE_CHECK(st.ok(), "SentencePiece Encode failed on a loaded model: " + st.ToString());
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
  int32_t eod() const override { return eos_; }
  std::string name() const override {
    return llama2_ ? "Llama2Tokenizer" : "GPTSentencePieceTokenizer";
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool llama2_;
  int pieces_ = 0;
  int32_t eos_ = -1;
  int32_t bos_ = -1;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_sentencepiece_tokenizer(const std::string& model_file,
                                                                bool llama2) {
  auto tok = std::make_unique<SentencePieceTokenizer>(llama2);
  TROUPE_RETURN_IF_ERROR(tok->load(model_file));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace troupe
