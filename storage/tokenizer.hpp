// Tokenizers: text <-> token ids. The kinds, named as Megatron's --tokenizer-type names them
// (docs/TOKENIZERS.md):
//
//   ByteLevelTokenizer  ids 0..255 are the UTF-8 bytes, 256 is end-of-document; vocab_size 257.
//                       Needs no files. Every byte string round-trips.
//   GPT2BPETokenizer    OpenAI's GPT-2 byte-level BPE from encoder.json (--vocab-file) and
//                       vocab.bpe (--merge-file); EOD is encoder["<|endoftext|>"] (50256),
//                       vocab_size 50257. Ids equal those of OpenAI's encoder.py (and of the npm
//                       package gpt-3-encoder).
//   GPTSentencePieceTokenizer  a SentencePiece model (--tokenizer-model FILE.model) through
//                       libsentencepiece: ids are SentencePiece's, no BOS added, EOD = eos_id(),
//                       vocab_size = the number of pieces (Megatron's _GPTSentencePieceTokenizer).
//   Llama2Tokenizer     the same, but every encode starts with bos_id() (Megatron's
//                       _Llama2Tokenizer.tokenize(s, bos=True, eos=False)).
//   HuggingFaceTokenizer  a Hugging Face tokenizer.json (--tokenizer-model DIR or FILE) of the
//                       byte-level BPE kind (GPT-2, LLaMA-3, BLOOM, ...): added tokens, Split
//                       regexes, ignore_merges and a TemplateProcessing prefix (a BOS) as Hugging
//                       Face's tokenizers apply them; EOD is tokenizer_config.json's eos_token,
//                       vocab_size the number of distinct tokens, added ones included, as
//                       Megatron's _HuggingFaceTokenizer (len(AutoTokenizer)). Other models,
//                       normalizers and pre-tokenizers are refused, naming the piece.
//   HFTokenizer         Megatron-DeepSpeed's name for a tokenizer.json (its _HFTokenizer, AutoTokenizer
//                       with use_fast=False): the same ids and EOD, but vocab_size is the model's own
//                       tokens (AutoTokenizer's vocab_size), without added tokens whose ids lie past
//                       them (LLaMA-3's 256 specials); the [PAD] it adds when a tokenizer has none is
//                       such a token and only pads its fine-tuning prompts.
//   NullTokenizer       no files: a vocabulary of N ids (the --vocab-size given as the "model"), EOD
//                       N - 1, text the ids in decimal separated by single spaces (Megatron-LM's
//                       NullTokenizer; Megatron-DeepSpeed's _NullTokenizer has N + 1 ids, EOD N). For
//                       mock data and plans; encode maps a word that is not an id below N to N - 1.
//
// Contract: encode adds no EOD of its own (callers append eod() where a document ends, as
// Megatron's --append-eod does); it adds what the Megatron tokenizer adds: Llama2Tokenizer's BOS, a
// tokenizer.json template's specials (LLaMA-3's BOS; a template ending in the eos token gives it
// too, as Megatron's ids have it). For the byte-level kinds decode(encode(x)) == x, less those
// specials (and the spaces of a tokenizer.json's add_prefix_space), for every byte string x,
// including invalid UTF-8; SentencePiece round-trips only what its normalizer leaves unchanged
// (NFKC, runs of spaces), as in Python. decode of an id outside [0, vocab_size()) (e.g. a padded
// vocabulary row) yields U+FFFD.
//
// Thread safety: a Tokenizer is immutable after construction except for internal caches, which are
// synchronised; encode and decode may be called from any number of threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The real vocabulary size, EOD included (before any padding to a multiple of 128).
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;
  virtual std::string name() const = 0;  // the --tokenizer-type value that makes this tokenizer
};

// The --tokenizer-type values make_tokenizer accepts, for help texts.
inline constexpr const char* kTokenizerTypes =
    "ByteLevelTokenizer, GPT2BPETokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, HuggingFaceTokenizer, "
    "HFTokenizer, NullTokenizer";

// Whether the type reads --tokenizer-model as a file (the SentencePiece kinds, HuggingFaceTokenizer
// and HFTokenizer).
bool tokenizer_uses_model(const std::string& type);

// Builds a tokenizer by type name. vocab_file / merge_file are used only by GPT2BPETokenizer,
// tokenizer_model only by the types tokenizer_uses_model names and by NullTokenizer (its vocabulary
// size in decimal); each is ignored otherwise. Fails,
// naming the flag and the fix, on an unknown type or a missing, unreadable, oversized or malformed
// file (bad input: a hostile file is refused, never a crash).
Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& type,
                                                  const std::string& vocab_file,
                                                  const std::string& merge_file,
                                                  const std::string& tokenizer_model = "");

std::unique_ptr<Tokenizer> make_byte_tokenizer();
Result<std::unique_ptr<Tokenizer>> make_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                           const std::string& merge_file);
// llama2: Llama2Tokenizer (BOS first) rather than GPTSentencePieceTokenizer.
Result<std::unique_ptr<Tokenizer>> make_sentencepiece_tokenizer(const std::string& model_file, bool llama2);
// The special pieces of a SentencePiece model (empty where the model has none), for the
// tokenizer_config.json of an export.
struct SentencePieceSpecials {
  std::string bos, eos, unk, pad;
};
Result<SentencePieceSpecials> sentencepiece_specials(const std::string& model_file);
// path: a folder holding tokenizer.json (and tokenizer_config.json), or the tokenizer.json itself.
// base_vocabulary: HFTokenizer's vocabulary size (above) instead of HuggingFaceTokenizer's.
Result<std::unique_ptr<Tokenizer>> make_hf_tokenizer(const std::string& path, bool base_vocabulary = false);
// The same from the files' contents (the fuzz target's way in): tokenizer_config may be empty.
Result<std::unique_ptr<Tokenizer>> make_hf_tokenizer_from_text(const std::string& tokenizer_json,
                                                               const std::string& tokenizer_config,
                                                               const std::string& where, bool base_vocabulary = false);
// NullTokenizer with `vocab_size` ids (>= 2).
Result<std::unique_ptr<Tokenizer>> make_null_tokenizer(int64_t vocab_size);

}  // namespace troupe
