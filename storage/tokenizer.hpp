// Tokenizers: text <-> token ids. Two kinds, named as Megatron's --tokenizer-type names them:
//
//   ByteLevelTokenizer  ids 0..255 are the UTF-8 bytes, 256 is end-of-document; vocab_size 257.
//                       Needs no files. Every byte string round-trips.
//   GPT2BPETokenizer    OpenAI's GPT-2 byte-level BPE from encoder.json (--vocab-file) and
//                       vocab.bpe (--merge-file); EOD is encoder["<|endoftext|>"] (50256),
//                       vocab_size 50257. Ids equal those of OpenAI's encoder.py (and of the npm
//                       package gpt-3-encoder).
//
// Contract: encode never adds EOD (callers append eod() where a document ends, as Megatron's
// --append-eod does). decode(encode(x)) == x for every byte string x, including invalid UTF-8.
// decode of an id outside [0, vocab_size()) (e.g. a padded vocabulary row) yields U+FFFD.
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
inline constexpr const char* kTokenizerTypes = "ByteLevelTokenizer, GPT2BPETokenizer";

// Builds a tokenizer by type name. vocab_file / merge_file are used only by GPT2BPETokenizer (and
// ignored otherwise). Fails, naming the flag and the fix, on an unknown type or a missing,
// unreadable or malformed vocab/merge file.
Result<std::unique_ptr<Tokenizer>> make_tokenizer(const std::string& type,
                                                  const std::string& vocab_file,
                                                  const std::string& merge_file);

std::unique_ptr<Tokenizer> make_byte_tokenizer();
Result<std::unique_ptr<Tokenizer>> make_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                           const std::string& merge_file);

}  // namespace troupe
