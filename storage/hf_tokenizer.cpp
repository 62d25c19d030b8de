// HuggingFaceTokenizer: a Hugging Face tokenizer.json of the byte-level BPE kind, applied the way
// Hugging Face's tokenizers library (behind Megatron's _HuggingFaceTokenizer, which wraps
// transformers.AutoTokenizer) applies it:
//
//   1. added_tokens are found first, in the raw text, leftmost and then longest (its Aho-Corasick
//      LeftmostLongest); each is its id, the text between them goes on.
//   2. pre_tokenizer: Split steps (a regex, behaviour Isolated) then ByteLevel (optionally a prefix
//      space per piece, optionally GPT-2's regex) cut each stretch into pieces.
//   3. model BPE on each piece's bytes: with ignore_merges, a piece that is itself a token is that
//      token; otherwise the adjacent pair of lowest merge rank, leftmost first, is merged, one at a
//      time, until none is left (tokenizers' Word::merge_all -- which differs from GPT-2's
//      encoder.py, which merges every occurrence of a pair before looking at the next, when a
//      merge creates a pair of lower rank).
//   4. post_processor TemplateProcessing: the special tokens before and after $A (LLaMA-3's
//      <|begin_of_text|>) are added to every sequence, as AutoTokenizer(text).input_ids does.
//
// What the file says that troupe does not implement is refused, naming it: other models (WordPiece,
// Unigram, WordLevel), a normalizer, other pre-tokenizers or Split behaviours, byte_fallback,
// dropout, subword prefixes/suffixes, added tokens with lstrip / rstrip / single_word, other
// post-processors (Roberta, Bert) and decoders.
//
// The end-of-document id is AutoTokenizer's eos_token_id: the eos_token of tokenizer_config.json
// (or special_tokens_map.json) beside tokenizer.json. vocab_size is len(AutoTokenizer): the
// distinct tokens, added ones included; troupe also requires their ids to be 0..n-1 (an embedding
// row for each).
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "storage/byte_level_bpe.hpp"
#include "storage/durable.hpp"
#include "storage/hf_regex.hpp"
#include "storage/json_input.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// LLaMA-3's tokenizer.json is 9 MB, BLOOM's 14 MB, Gemma-3's 33 MB.
constexpr size_t kMaxJsonBytes = size_t{128} << 20;
constexpr size_t kMaxConfigBytes = size_t{4} << 20;
constexpr size_t kMaxVocab = size_t{1} << 22;  // 4 Mi tokens (the largest real ones: 262k)
constexpr size_t kMaxMerges = size_t{1} << 22;
constexpr size_t kMaxAddedTokens = size_t{1} << 16;
constexpr size_t kMaxSplits = 16;

constexpr const char* kFix =
    "HuggingFaceTokenizer reads byte-level BPE tokenizer.json files (GPT-2, LLaMA-3, BLOOM and "
    "their "
    "kin); use the tokenizer the data was (or is to be) tokenised with, in the form Hugging Face "
    "saves it";

// GPT-2's pre-tokenisation pattern: ByteLevel's use_regex.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string shown(const std::string& s) {
  return json_excerpt(json(s), 40);
}


// The bytes a byte-level spelling stands for, or nullopt when a character is outside the alphabet.
std::optional<std::string> unspell(const std::string& token,
                                   const std::unordered_map<int32_t, int>& cp_to_byte) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    utf8proc_int32_t cp = -1;
    const utf8proc_ssize_t len =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token.data() + i),
                         static_cast<utf8proc_ssize_t>(token.size() - i), &cp);
    if (len <= 0) return std::nullopt;
    auto it = cp_to_byte.find(cp);
    if (it == cp_to_byte.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(it->second));
    i += static_cast<size_t>(len);
  }
  return bytes;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct AddedToken {
  std::string content;
  int32_t id;
};

class HfTokenizer final : public Tokenizer {
 public:
  // base_vocabulary: Megatron-DeepSpeed's HFTokenizer, whose vocabulary is the model's own tokens
  // (AutoTokenizer's vocab_size), without added tokens whose ids lie past them.
  explicit HfTokenizer(bool base_vocabulary) : base_vocabulary_(base_vocabulary) {}
  Status load(const json& root, const json& config, const std::string& where);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override {
    return base_vocabulary_ ? static_cast<int64_t>(id_of_spelling_.size()) : static_cast<int64_t>(id_bytes_.size());
  }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return base_vocabulary_ ? "HFTokenizer" : "HuggingFaceTokenizer"; }

 private:
  Status load_model(const json& model, std::vector<std::string>* problems);
  Status load_pre_tokenizer(const json& pre, std::vector<std::string>* problems);
  void load_post_processor(const json& post, std::vector<std::string>* problems);
  void encode_stretch(std::string_view text, std::vector<int32_t>* out) const;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void bpe_cached(std::string_view piece, std::vector<int32_t>* out) const;
  const AddedToken* added_at(std::string_view text, size_t pos) const;

  bool base_vocabulary_ = false;
  // Model.
  std::unordered_map<std::string, int32_t> id_of_spelling_;  // tokens as the file spells them
  std::unordered_map<std::string, int32_t> id_of_bytes_;     // byte-level tokens by their bytes
  std::vector<std::string> id_bytes_;                        // (vocab_size) what each id decodes to
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // pair -> (rank, merged id)
  bool ignore_merges_ = false;
  // Pre-tokenizer.
  std::vector<Regex> splits_;  // Split steps, in order (each Isolated)
  bool prefix_space_ = false;  // ByteLevel's add_prefix_space
  bool gpt2_regex_ = false;    // ByteLevel's use_regex
  Regex gpt2_;
  // Added tokens by first byte, longest first.
  std::array<std::vector<AddedToken>, 256> added_;
  // Post-processor.
  std::vector<int32_t> prefix_, suffix_;
  int32_t eod_ = -1;

  PieceCache cache_;
};

// A string member, or "" when absent or null; a present non-string is reported.
std::string text_of(const json& obj, const char* key, const std::string& path,
                    std::vector<std::string>* problems) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  if (!it->is_string()) {
    problems->push_back(path + "." + key + " is " + json_excerpt(*it) + ", not a string");
    return "";
  }
  return it->get<std::string>();
}

bool flag_of(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

std::string type_of(const json& obj) {
  auto it = obj.find("type");
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

Status HfTokenizer::load_model(const json& model, std::vector<std::string>* problems) {
  if (!model.is_object())
    return Status::bad_input("model is " + json_excerpt(model) + ", not an object");
  const std::string type = type_of(model);
  if (!type.empty() && type != "BPE") {
    // Reported with the file's other problems; its vocabulary is another model's, not read.
    problems->push_back("model.type is " + shown(type) +
                        ", which troupe does not implement (only BPE)");
    return Status::ok();
  }
  if (auto d = model.find("dropout");
      d != model.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0))
    problems->push_back("model.dropout " + json_excerpt(*d) +
                        " (BPE-dropout) is not supported: it must be null");
  if (!text_of(model, "continuing_subword_prefix", "model", problems).empty())
    problems->push_back(
        "model.continuing_subword_prefix is not supported (byte-level BPE has none)");
  if (!text_of(model, "end_of_word_suffix", "model", problems).empty())
    problems->push_back("model.end_of_word_suffix is not supported (byte-level BPE has none)");
  if (flag_of(model, "byte_fallback"))
    problems->push_back(
        "model.byte_fallback (a SentencePiece-style BPE, as LLaMA-2's tokenizer.json) is not "
        "supported -- use Llama2Tokenizer with its tokenizer.model");
  ignore_merges_ = flag_of(model, "ignore_merges");

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object() || vocab_it->empty())
    return Status::bad_input("model.vocab is missing or not an object of token -> id");
  const json& vocab = *vocab_it;
  if (vocab.size() > kMaxVocab)
    return Status::bad_input("model.vocab has " + std::to_string(vocab.size()) +
                             " tokens, more than the " + std::to_string(kMaxVocab) +
                             " troupe reads");
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= int64_t(kMaxVocab)) {
      return Status::bad_input("model.vocab[" + shown(token) + "] is " + json_excerpt(value) +
                               ", not an id in [0, " + std::to_string(kMaxVocab) + ")");
    }
    id_of_spelling_.emplace(token, value.get<int32_t>());
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array())
    return Status::bad_input("model.merges is missing or not an array");
  if (merges_it->size() > kMaxMerges)
    return Status::bad_input("model.merges has " + std::to_string(merges_it->size()) +
                             " merges, more than the " + std::to_string(kMaxMerges) +
                             " troupe reads");
  merges_.reserve(merges_it->size());
  int32_t rank = 0;
  for (const json& m : *merges_it) {
    // Two spellings: "left right" (tokenizers < 0.20) and ["left", "right"] (later ones, which
    // allow spaces inside a token).
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos || space == 0 ||
          space + 1 == s.size())
        return Status::bad_input("model.merges[" + std::to_string(rank) + "] is " + shown(s) +
                                 ", not \"left right\"");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Status::bad_input("model.merges[" + std::to_string(rank) + "] is " + json_excerpt(m) +
                               ", neither \"left right\" nor [\"left\", \"right\"]");
    }
    auto l = id_of_spelling_.find(left), r = id_of_spelling_.find(right),
         lr = id_of_spelling_.find(left + right);
    if (l == id_of_spelling_.end() || r == id_of_spelling_.end() || lr == id_of_spelling_.end())
      return Status::bad_input("model.merges[" + std::to_string(rank) + "] merges " + shown(left) +
                               " and " + shown(right) + ", but model.vocab lacks " +
                               shown(l == id_of_spelling_.end()   ? left
                                     : r == id_of_spelling_.end() ? right
                                                                  : left + right));
    // A repeated pair keeps its last rank, as tokenizers' map of merges does.
    merges_[pair_key(l->second, r->second)] = {rank, lr->second};
    ++rank;
  }
  return Status::ok();
}

Status HfTokenizer::load_pre_tokenizer(const json& pre, std::vector<std::string>* problems) {
  std::vector<const json*> steps;
  if (pre.is_object() && type_of(pre) == "Sequence") {
    auto list = pre.find("pretokenizers");
    if (list == pre.end() || !list->is_array())
      return Status::bad_input("pre_tokenizer Sequence has no \"pretokenizers\" array");
    for (const json& s : *list) steps.push_back(&s);
  } else if (!pre.is_null()) {
    steps.push_back(&pre);
  }
  bool byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = *steps[i];
    const std::string where = "pre_tokenizer step " + std::to_string(i);
    if (!s.is_object())
      return Status::bad_input(where + " is " + json_excerpt(s) + ", not an object");
    const std::string type = type_of(s);
    if (byte_level) {
      problems->push_back(where + " (" + shown(type) +
                          ") comes after ByteLevel: troupe needs ByteLevel last");
      continue;
    }
    if (type == "ByteLevel") {
      byte_level = true;
      prefix_space_ = flag_of(s, "add_prefix_space");
      auto use_regex = s.find("use_regex");
      gpt2_regex_ = use_regex == s.end() || !use_regex->is_boolean() ||
                    use_regex->get<bool>();  // default true
      if (gpt2_regex_) {
        auto re = Regex::compile(kGpt2Pattern, false);
        TROUPE_CHECK(re.is_ok(), "GPT-2's pattern must compile: " + re.status().message());
        gpt2_ = *re;
      }
    } else if (type == "Split") {
      if (splits_.size() >= kMaxSplits) {
        problems->push_back(where + ": more than " + std::to_string(kMaxSplits) + " Split steps");
        continue;
      }
      const std::string behavior = text_of(s, "behavior", where, problems);
      if (behavior != "Isolated")
        problems->push_back(where + " Split has behavior " + shown(behavior) +
                            ", which troupe does not implement (only Isolated)");
      if (flag_of(s, "invert"))
        problems->push_back(where + " Split has invert true, which troupe does not implement");
      auto pattern = s.find("pattern");
      const bool is_regex = pattern != s.end() && pattern->is_object() &&
                            pattern->contains("Regex") && (*pattern)["Regex"].is_string();
      const bool is_string = pattern != s.end() && pattern->is_object() &&
                             pattern->contains("String") && (*pattern)["String"].is_string();
      if (!is_regex && !is_string) {
        problems->push_back(where + " Split has no pattern {\"Regex\": ...} or {\"String\": ...}");
        continue;
      }
      const std::string text = (*pattern)[is_regex ? "Regex" : "String"].get<std::string>();
      auto re = Regex::compile(text, !is_regex);
      if (!re) {
        problems->push_back(where + " Split pattern " + shown(text) + ": " + re.status().message());
        continue;
      }
      splits_.push_back(*re);
    } else {
      problems->push_back(
          where + " is " + (type.empty() ? json_excerpt(s) : shown(type)) +
          ", a pre-tokenizer troupe does not implement (Split, ByteLevel and Sequence it does)");
    }
  }
  if (!byte_level)
    problems->push_back("pre_tokenizer has no ByteLevel step: troupe reads byte-level BPE only");
  return Status::ok();
}

void HfTokenizer::load_post_processor(const json& post, std::vector<std::string>* problems) {
  std::vector<const json*> steps;
  if (post.is_object() && type_of(post) == "Sequence" && post.contains("processors") &&
      post["processors"].is_array()) {
    for (const json& p : post["processors"]) steps.push_back(&p);
  } else if (!post.is_null()) {
    steps.push_back(&post);
  }
  for (const json* p : steps) {
    const std::string type = p->is_object() ? type_of(*p) : "";
    if (type == "ByteLevel") continue;  // it trims offsets only; ids are untouched
    if (type != "TemplateProcessing") {
      problems->push_back("post_processor " + (type.empty() ? json_excerpt(*p) : shown(type)) +
                          " is not implemented (ByteLevel and TemplateProcessing are)");
      continue;
    }
    auto single = p->find("single");
    auto specials = p->find("special_tokens");
    if (single == p->end() || !single->is_array()) {
      problems->push_back("post_processor TemplateProcessing has no \"single\" template");
      continue;
    }
    bool seen_a = false;
    for (const json& item : *single) {
      if (item.is_object() && item.contains("Sequence")) {
        if (seen_a) problems->push_back("post_processor TemplateProcessing names a sequence twice");
        seen_a = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken") ||
          !item["SpecialToken"].is_object() || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        problems->push_back(
            "post_processor TemplateProcessing item " + json_excerpt(item) +
            " is neither {\"Sequence\": ...} nor {\"SpecialToken\": {\"id\": ...}}");
        continue;
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      const json* entry = specials != p->end() && specials->is_object() && specials->contains(name)
                              ? &(*specials)[name]
                              : nullptr;
      if (entry == nullptr || !entry->is_object() || !entry->contains("ids") ||
          !(*entry)["ids"].is_array()) {
        problems->push_back("post_processor TemplateProcessing uses " + shown(name) +
                            ", which its special_tokens do not define with \"ids\"");
        continue;
      }
      for (const json& id : (*entry)["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= int64_t(kMaxVocab)) {
          problems->push_back("post_processor special token " + shown(name) + " has id " +
                              json_excerpt(id));
          continue;
        }
        (seen_a ? suffix_ : prefix_).push_back(id.get<int32_t>());
      }
    }
    if (!seen_a)
      problems->push_back("post_processor TemplateProcessing's single template has no $A");
  }
}

// The eos_token of a tokenizer_config.json / special_tokens_map.json: a string or an AddedToken
// object {"content": ...}.
std::string eos_of(const json& config) {
  if (!config.is_object()) return "";
  auto it = config.find("eos_token");
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

Status HfTokenizer::load(const json& root, const json& config, const std::string& where) {
  const auto bad = [&](const std::string& what) {
    return Status::bad_input(where + what + " -- " + kFix);
  };
  if (!root.is_object()) return bad("not a JSON object");
  std::vector<std::string> problems;
  {
    auto model = root.find("model");
    if (model == root.end()) return bad("has no \"model\"");
    if (Status st = load_model(*model, &problems); !st) return bad(st.message());
  }
  if (auto n = root.find("normalizer"); n != root.end() && !n->is_null()) {
    const bool empty_sequence = type_of(*n) == "Sequence" && n->contains("normalizers") &&
                                (*n)["normalizers"].is_array() && (*n)["normalizers"].empty();
    if (!empty_sequence)
      problems.push_back("normalizer " +
                         (type_of(*n).empty() ? json_excerpt(*n) : shown(type_of(*n))) +
                         " is not implemented (troupe reads tokenizers without a normalizer)");
  }
  {
    auto pre = root.find("pre_tokenizer");
    if (Status st = load_pre_tokenizer(pre == root.end() ? json() : *pre, &problems); !st)
      return bad(st.message());
  }
  if (auto post = root.find("post_processor"); post != root.end())
    load_post_processor(*post, &problems);
  {
    auto dec = root.find("decoder");
    const json* d = dec == root.end() ? nullptr : &*dec;
    if (d && type_of(*d) == "Sequence" && d->contains("decoders") && (*d)["decoders"].is_array() &&
        (*d)["decoders"].size() == 1)
      d = &(*d)["decoders"][0];
    if (d == nullptr || type_of(*d) != "ByteLevel")
      problems.push_back("decoder " + (d == nullptr ? std::string("(none)") : json_excerpt(*d)) +
                         " is not ByteLevel, which byte-level BPE decodes with");
  }

  // added_tokens: [{"id", "content", "special", "lstrip", "rstrip", "single_word", "normalized"}].
  std::vector<AddedToken> added;
  if (auto list = root.find("added_tokens"); list != root.end() && !list->is_null()) {
    if (!list->is_array()) return bad("added_tokens is not an array");
    if (list->size() > kMaxAddedTokens)
      return bad("added_tokens has " + std::to_string(list->size()) + " tokens, more than the " +
                 std::to_string(kMaxAddedTokens) + " troupe reads");
    for (const json& t : *list) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
          t["content"].get<std::string>().empty() || !t.contains("id") ||
          !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() >= int64_t(kMaxVocab))
        return bad("added_tokens item " + json_excerpt(t) +
                   " lacks a non-empty \"content\" or an id in [0, " + std::to_string(kMaxVocab) +
                   ")");
      AddedToken a{t["content"].get<std::string>(), t["id"].get<int32_t>()};
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (flag_of(t, key))
          problems.push_back("added token " + shown(a.content) + " has " + key +
                             " true, which troupe does not implement");
      added.push_back(std::move(a));
    }
  }

  // The id space: the vocab's tokens and the added ones; a string has one id and the ids must be
  // exactly 0..n-1.
  std::map<int32_t, std::string> token_of_id;
  for (const auto& [token, id] : id_of_spelling_) {
    auto [it, fresh] = token_of_id.emplace(id, token);
    if (!fresh) {
      problems.push_back("model.vocab gives id " + std::to_string(id) + " to both " +
                         shown(it->second) + " and " + shown(token));
      break;
    }
  }
  std::unordered_map<std::string, int32_t> added_id;
  for (const AddedToken& a : added) {
    auto v = id_of_spelling_.find(a.content);
    auto [it, fresh] = token_of_id.emplace(a.id, a.content);
    if ((v != id_of_spelling_.end() && v->second != a.id) || (!fresh && it->second != a.content))
      problems.push_back("added token " + shown(a.content) + " has id " + std::to_string(a.id) +
                         ", which the vocabulary gives to " +
                         shown(v != id_of_spelling_.end() && v->second != a.id
                                   ? a.content + " as " + std::to_string(v->second)
                                   : it->second));
    auto [at, first] = added_id.emplace(a.content, a.id);
    if (!first && at->second != a.id)
      problems.push_back("added token " + shown(a.content) + " appears twice");
  }
  if (!problems.empty()) {
    std::string message = problems[0];
    for (size_t i = 1; i < problems.size(); ++i) message += "; " + problems[i];
    return bad(message);
  }
  const size_t n = token_of_id.size();
  if (token_of_id.rbegin()->first != static_cast<int32_t>(n - 1)) {
    int32_t missing = 0;
    for (const auto& [id, token] : token_of_id) {
      if (id != missing) break;
      ++missing;
    }
    return bad("the token ids are not 0.." + std::to_string(n - 1) + ": no token has id " +
               std::to_string(missing) + " (an embedding row would have no token)");
  }

  // What each id decodes to: a byte-level spelling's bytes; a token spelt otherwise (an added
  // token such as "<|begin_of_text|>" is usually in the alphabet too) its UTF-8 as is, as the
  // ByteLevel decoder does.
  const std::array<int32_t, 256> byte_to_cp = bytes_to_unicode();
  std::unordered_map<int32_t, int> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = b;
  id_bytes_.assign(n, std::string());
  for (const auto& [id, token] : token_of_id) {
    auto bytes = unspell(token, cp_to_byte);
    id_bytes_[id] = bytes ? *bytes : token;
    if (bytes && id_of_spelling_.count(token)) id_of_bytes_.emplace(*bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    utf8proc_uint8_t buf[4];
    symbol.assign(reinterpret_cast<const char*>(buf),
                  static_cast<size_t>(utf8proc_encode_char(byte_to_cp[b], buf)));
    auto it = id_of_spelling_.find(symbol);
    if (it == id_of_spelling_.end())
      return bad("model.vocab has no token for byte " + std::to_string(b) + " (" + shown(symbol) +
                 "): a byte-level vocabulary has all 256");
    byte_ids_[b] = it->second;
  }
  for (AddedToken& a : added) {
    auto& bucket = added_[static_cast<unsigned char>(a.content[0])];
    bucket.push_back(std::move(a));
  }
  for (auto& bucket : added_)
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
  for (int32_t id : prefix_)
    if (id >= static_cast<int32_t>(n))
      return bad("post_processor's special token id " + std::to_string(id) +
                 " is outside the vocabulary");
  for (int32_t id : suffix_)
    if (id >= static_cast<int32_t>(n))
      return bad("post_processor's special token id " + std::to_string(id) +
                 " is outside the vocabulary");

  const std::string eos = eos_of(config);
  if (eos.empty())
    return Status::bad_input(
        where +
        "no eos_token: Megatron's HuggingFaceTokenizer ends documents with "
        "AutoTokenizer's eos_token_id, which tokenizer_config.json (or special_tokens_map.json) "
        "beside tokenizer.json names -- put the model's tokenizer_config.json there");
  if (auto a = added_id.find(eos); a != added_id.end()) {
    eod_ = a->second;
  } else if (auto v = id_of_spelling_.find(eos); v != id_of_spelling_.end()) {
    eod_ = v->second;
  } else {
    return Status::bad_input(where + "the eos_token " + shown(eos) +
                             " of tokenizer_config.json is not a token of tokenizer.json -- use "
                             "the two files of one model");
  }
  return Status::ok();
}

const AddedToken* HfTokenizer::added_at(std::string_view text, size_t pos) const {
  for (const AddedToken& a : added_[static_cast<unsigned char>(text[pos])])
    if (text.compare(pos, a.content.size(), a.content) == 0) return &a;  // longest first
  return nullptr;
}

void HfTokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    auto it = id_of_bytes_.find(std::string(piece));
    if (it != id_of_bytes_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> id(n), next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  // (rank, position of the left symbol, the merged id); the lowest rank first, then the leftmost.
  using Candidate = std::tuple<int32_t, int32_t, int32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges_.find(pair_key(id[left], id[next[left]]));
    if (it != merges_.end()) heap.emplace(it->second.first, left, it->second.second);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<uint8_t> alive(n, 1);
  while (!heap.empty()) {
    const auto [rank, p, merged] = heap.top();
    heap.pop();
    // Stale: a symbol of the pair was merged since it was pushed.
    if (!alive[p] || next[p] < 0) continue;
    auto it = merges_.find(pair_key(id[p], id[next[p]]));
    if (it == merges_.end() || it->second.first != rank) continue;
    const int32_t q = next[p];
    id[p] = merged;
    alive[q] = 0;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    push(prev[p]);
    push(p);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(id[i]);
}

void HfTokenizer::bpe_cached(std::string_view piece, std::vector<int32_t>* out) const {
  cache_.encode(piece, out, [this](std::string_view p, std::vector<int32_t>* o) { bpe(p, o); });
}

// One stretch of text between added tokens: the pre-tokenizer's pieces, each through BPE.
void HfTokenizer::encode_stretch(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::vector<std::string> pieces{std::string(text)};
  auto isolate = [](const Regex& re, const std::vector<std::string>& in) {
    std::vector<std::string> result;
    for (const std::string& s : in) {
      size_t pos = 0;
      for (const auto& [begin, end] : re.find_all(s)) {
        if (begin > pos) result.emplace_back(s, pos, begin - pos);
        result.emplace_back(s, begin, end - begin);
        pos = end;
      }
      if (pos < s.size()) result.emplace_back(s, pos);
    }
    return result;
  };
  for (const Regex& re : splits_) pieces = isolate(re, pieces);
  if (prefix_space_)
    for (std::string& s : pieces)
      if (s.empty() || s[0] != ' ') s.insert(s.begin(), ' ');
  if (gpt2_regex_) pieces = isolate(gpt2_, pieces);
  for (const std::string& s : pieces)
    if (!s.empty()) bpe_cached(s, out);
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(prefix_);
  ids.reserve(text.size() / 3 + prefix_.size() + suffix_.size() + 1);
  size_t start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* a =
        added_[static_cast<unsigned char>(text[pos])].empty() ? nullptr : added_at(text, pos);
    if (a == nullptr) {
      ++pos;
      continue;
    }
    encode_stretch(text.substr(start, pos - start), &ids);
    ids.push_back(a->id);
    pos += a->content.size();
    start = pos;
  }
  encode_stretch(text.substr(start), &ids);
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size()) {
      out += id_bytes_[id];
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
  }
  return out;
}

Result<json> parse(const std::string& text, const std::string& what) {
  JsonParseOptions options;
  options.max_depth = 32;
  return parse_json(text, what, options);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_hf_tokenizer_from_text(const std::string& tokenizer_json,
                                                               const std::string& tokenizer_config,
                                                               const std::string& where, bool base_vocabulary) {
  auto root = parse(tokenizer_json, where);
  if (!root) return Status::bad_input(root.status().message() + " -- " + kFix);
  json config;
  if (!tokenizer_config.empty()) {
    auto parsed = parse(tokenizer_config, where + " (its tokenizer_config.json)");
    if (!parsed) return Status::bad_input(parsed.status().message() + " -- " + kFix);
    config = std::move(*parsed);
  }
  auto tok = std::make_unique<HfTokenizer>(base_vocabulary);
  TROUPE_RETURN_IF_ERROR(tok->load(*root, config, where + ": "));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Result<std::unique_ptr<Tokenizer>> make_hf_tokenizer(const std::string& path, bool base_vocabulary) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path file = is_dir ? fs::path(path) / "tokenizer.json" : fs::path(path);
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const std::string where = "--tokenizer-model '" + file.string() + "'";
  auto text = read_small_file(file.string(), kMaxJsonBytes);
  if (!text)
    return Status::bad_input("--tokenizer-model '" + path + "': " + text.status().message() +
                             (is_dir ? " (a model folder holds tokenizer.json)" : "") + " -- " +
                             kFix);
  // The eos_token lives beside it: tokenizer_config.json, else special_tokens_map.json.
  std::string config;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path p = dir / name;
    if (!fs::exists(p, ec)) continue;
    auto c = read_small_file(p.string(), kMaxConfigBytes);
    if (!c) return Status::bad_input("--tokenizer-model: " + c.status().message() + " -- " + kFix);
    auto parsed = parse(*c, p.string());
    if (!parsed) return Status::bad_input(parsed.status().message() + " -- " + kFix);
    if (!eos_of(*parsed).empty()) {
      config = std::move(*c);
      break;
    }
  }
  return make_hf_tokenizer_from_text(*text, config, where, base_vocabulary);
}

}  // namespace troupe
