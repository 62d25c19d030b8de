// GPT2BPETokenizer: OpenAI's GPT-2 byte-level BPE (encoder.py), reimplemented.
//
// encode = pre-tokenise with GPT-2's pattern, map each piece's bytes to the byte-level alphabet,
// apply BPE merges by rank, look the symbols up in encoder.json. Every symbol a merge produces is
// itself in encoder.json (checked at load), so BPE runs on ids instead of strings.
//
// The pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  is
// matched by a hand-written scanner (scan_piece) over code points. \p{L} / \p{N} are the Unicode
// general categories L* / N* from utf8proc; \s is the White_Space property, as Python's `regex`
// module defines it (it differs from JavaScript's \s only at U+0085, which JS does not count, and
// U+FEFF, which JS does). Bytes that are not valid UTF-8 count as one "other" character each, so
// any byte string encodes. Categories are those of the linked utf8proc's Unicode version (2.8:
// Unicode 15); code points assigned later count as "other", which is where an oracle built on a
// newer Unicode (e.g. node's ICU) can split differently.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "storage/byte_level_bpe.hpp"
#include "storage/json_input.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

constexpr const char* kVocabFix =
    "pass GPT-2's encoder.json (scripts/setup.sh puts one in .deps/gpt2/encoder.json)";
constexpr const char* kMergeFix =
    "pass GPT-2's vocab.bpe, the merge file that belongs to the encoder.json (scripts/setup.sh "
    "puts one "
    "in .deps/gpt2/vocab.bpe)";

// A string from a file for a message: JSON-quoted (control bytes escaped) and cut to 40 characters.
std::string shown(const std::string& s) {
  return json_excerpt(nlohmann::json(s), 40);
}


void append_utf8(int32_t cp, std::string* out) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// ---- pre-tokenisation ----

enum class CharClass : uint8_t { letter, number, space, other };

CharClass classify(int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return CharClass::space;  // White_Space controls
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::letter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::number;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return CharClass::space;  // every Z* code point has White_Space, and no other does
    default:
      return CharClass::other;
  }
}

const std::array<CharClass, 128>& ascii_classes() {
  static const std::array<CharClass, 128> table = [] {
    std::array<CharClass, 128> t{};
    for (int c = 0; c < 128; ++c) t[c] = classify(c);
    return t;
  }();
  return table;
}

// The class and byte length of the code point at byte `pos` (< text.size()).
struct CodePoint {
  CharClass cls;
  size_t len;
};

CodePoint code_point_at(std::string_view text, size_t pos) {
  auto c = static_cast<unsigned char>(text[pos]);
  if (c < 0x80) return {ascii_classes()[c], 1};
  utf8proc_int32_t cp = -1;
  utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                       static_cast<utf8proc_ssize_t>(text.size() - pos), &cp);
  if (n <= 0 || cp < 0) return {CharClass::other, 1};  // an invalid byte stands alone
  return {classify(cp), static_cast<size_t>(n)};
}

// The end of the run of code points of class `cls` that starts at byte `pos`.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    CodePoint c = code_point_at(text, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

// The end (byte offset) of the pattern's match starting at byte `pos`, alternatives tried in the
// pattern's order (the regex engine's leftmost-first semantics).
size_t scan_piece(std::string_view text, size_t pos) {
  const size_t size = text.size();
  auto byte_at = [&](size_t i) -> int {
    return i < size ? static_cast<unsigned char>(text[i]) : -1;  // ASCII bytes are code points
  };
  // 's|'t|'re|'ve|'m|'ll|'d
  if (byte_at(pos) == '\'') {
    int a = byte_at(pos + 1), b = byte_at(pos + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  }
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+   (with the optional space first, then without)
  if (byte_at(pos) == ' ' && pos + 1 < size) {
    CodePoint next = code_point_at(text, pos + 1);
    if (next.cls != CharClass::space) return run_end(text, pos + 1, next.cls);
  }
  CodePoint first = code_point_at(text, pos);
  if (first.cls != CharClass::space) return run_end(text, pos, first.cls);
  // \s+(?!\S) | \s+ : the greedy run, giving back its last character when a non-space follows.
  size_t end = pos, last = pos;
  while (end < size) {
    CodePoint c = code_point_at(text, end);
    if (c.cls != CharClass::space) break;
    last = end;
    end += c.len;
  }
  if (end < size && last > pos) return last;
  return end;
}

// ---- the tokenizer ----

struct Merge {
  int32_t left;
  int32_t right;
  int32_t merged;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// pair_key -> rank, open addressing with linear probing: the hottest lookup of encoding, and a
// std::unordered_map costs a pointer chase per probe.
class PairRanks {
 public:
  void reserve(size_t count) {
    size_t cap = 16;
    while (cap < 4 * count) cap *= 2;
    keys_.assign(cap, kEmpty);
    ranks_.assign(cap, -1);
    mask_ = cap - 1;
  }
  void insert_or_assign(uint64_t key, int32_t rank) {
    TROUPE_CHECK(key != kEmpty && size_ * 2 < keys_.size(), "PairRanks: reserve() enough first");
    size_t i = slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = key;
    ranks_[i] = rank;
  }
  int32_t find(uint64_t key) const {  // -1 when absent
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return ranks_[i];
      if (keys_[i] == kEmpty) return -1;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are < 2^31, so no key is all ones
  size_t slot(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<uint64_t> keys_;
  std::vector<int32_t> ranks_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Per-thread working memory of bpe(), reused across calls.
struct BpeScratch {
  std::vector<int32_t> id, next, prev;
  std::vector<uint8_t> alive;
  std::vector<std::pair<int32_t, int32_t>> heap;  // (rank, position of the left symbol), min-heap
  std::vector<int32_t> batch;
};

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_bytes_.size()); }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

  Status load(const std::string& vocab_file, const std::string& merge_file);

 private:
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void bpe_cached(std::string_view piece, std::vector<int32_t>* out) const;

  std::array<int32_t, 256> byte_ids_{};  // id of each single byte's symbol
  std::vector<std::string> id_bytes_;    // (vocab_size) the bytes each id decodes to
  std::vector<Merge> merges_;            // by rank
  PairRanks rank_of_;                    // pair_key(left, right) -> rank
  int32_t eod_ = -1;

  PieceCache cache_;
};

// GPT-2's encoder.json is 1 MB and vocab.bpe 0.5 MB; vocabularies of a few hundred thousand tokens
// stay far below this. A larger file is not a vocabulary, and reading it would only exhaust memory.
constexpr int64_t kMaxVocabFileBytes = int64_t{256} << 20;

// The whole of a regular file (a FIFO, a device such as /dev/zero or a directory is refused before
// anything is read or allocated).
Result<std::string> read_file(const std::string& path, const char* flag, const char* fix) {
  if (path.empty()) {
    return Status::bad_input(std::string(flag) +
                         " is required for --tokenizer-type GPT2BPETokenizer -- " + fix);
  }
  const auto fail = [&](const std::string& why) {
    return Status::bad_input(std::string(flag) + " '" + path + "' " + why + " -- " + fix);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(std::string("cannot be read (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("is not a regular file");
  }
  if (st.st_size > kMaxVocabFileBytes) {
    ::close(fd);
    return fail("is " + std::to_string(st.st_size >> 20) + " MiB, larger than any vocabulary (" +
                std::to_string(kMaxVocabFileBytes >> 20) + " MiB at most)");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return fail(std::string("cannot be read (") + std::strerror(err) + ")");
    }
    if (n == 0) break;  // the file shrank while being read: parse what is there
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

Status Gpt2BpeTokenizer::load(const std::string& vocab_file, const std::string& merge_file) {
  auto vocab_text = read_file(vocab_file, "--vocab-file", kVocabFix);
  if (!vocab_text) return vocab_text.status();
  auto merge_text = read_file(merge_file, "--merge-file", kMergeFix);
  if (!merge_text) return merge_text.status();
  const std::string vocab_where = "--vocab-file '" + vocab_file + "': ";
  const std::string merge_where = "--merge-file '" + merge_file + "': ";

  // encoder.json: {"token": id, ...} with ids a permutation of 0..n-1.
  auto parsed = parse_json(*vocab_text, "--vocab-file '" + vocab_file + "'");
  if (!parsed) return Status::bad_input(parsed.status().message() + " -- " + kVocabFix);
  const nlohmann::json& encoder = parsed.value();
  if (!encoder.is_object() || encoder.empty()) {
    return Status::bad_input(vocab_where + "not a JSON object of token -> id -- " + kVocabFix);
  }
  std::array<int32_t, 256> byte_to_cp = bytes_to_unicode();
  std::unordered_map<int32_t, int> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = b;

  const size_t n = encoder.size();
  std::unordered_map<std::string, int32_t> id_of;
  id_of.reserve(n);
  id_bytes_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  for (const auto& [token, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= int64_t(n) || seen[value.get<size_t>()]) {
      return Status::bad_input(vocab_where + "token " + shown(token) + " has id " +
                           json_excerpt(value) + ", but ids must be distinct integers in [0, " +
                           std::to_string(n) + ") -- " + kVocabFix);
    }
    auto id = value.get<int32_t>();
    seen[id] = true;
    id_of.emplace(token, id);
    // The token is spelt in the byte-level alphabet; its bytes are the inverse map of each code
    // point.
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      utf8proc_int32_t cp = -1;
      utf8proc_ssize_t len =
          utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token.data() + i),
                           static_cast<utf8proc_ssize_t>(token.size() - i), &cp);
      auto it = len > 0 ? cp_to_byte.find(cp) : cp_to_byte.end();
      if (it == cp_to_byte.end()) {
        return Status::bad_input(vocab_where + "token " + shown(token) +
                             " is not spelt in GPT-2's byte-level alphabet -- " + kVocabFix);
      }
      bytes.push_back(static_cast<char>(it->second));
      i += static_cast<size_t>(len);
    }
    id_bytes_[id] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(byte_to_cp[b], &symbol);
    auto it = id_of.find(symbol);
    if (it == id_of.end()) {
      return Status::bad_input(vocab_where + "has no token for byte " + std::to_string(b) + " -- " +
                           kVocabFix);
    }
    byte_ids_[b] = it->second;
  }
  auto eod = id_of.find("<|endoftext|>");
  if (eod == id_of.end()) {
    return Status::bad_input(vocab_where + "has no \"<|endoftext|>\" token -- " + kVocabFix);
  }
  eod_ = eod->second;

  // vocab.bpe: "#version: ..." then one merge "left right" per line, by rank.
  std::istringstream lines(*merge_text);
  std::string line;
  int64_t line_no = 0;
  rank_of_.reserve(static_cast<size_t>(std::count(merge_text->begin(), merge_text->end(), '\n')) +
                   1);
  while (std::getline(lines, line)) {
    ++line_no;
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream fields(line);
    std::string left, right, extra;
    fields >> left >> right;
    if (left.empty()) continue;  // the blank last line
    if (right.empty() || (fields >> extra)) {
      return Status::bad_input(merge_where + "line " + std::to_string(line_no) +
                           " is not '<left> <right>' -- " + kMergeFix);
    }
    auto l = id_of.find(left), r = id_of.find(right), lr = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || lr == id_of.end()) {
      return Status::bad_input(merge_where + "line " + std::to_string(line_no) + " merges " +
                           shown(left) + " and " + shown(right) + ", which --vocab-file '" +
                           vocab_file + "' does not have -- " + kMergeFix);
    }
    auto rank = static_cast<int32_t>(merges_.size());
    merges_.push_back({l->second, r->second, lr->second});
    // A repeated pair keeps its last rank, as encoder.py's dict(zip(merges, range(...))) does.
    rank_of_.insert_or_assign(pair_key(l->second, r->second), rank);
  }
  if (merges_.empty()) return Status::bad_input(merge_where + "has no merges -- " + kMergeFix);
  return Status::ok();
}

// BPE over one piece, as encoder.py's bpe(): repeatedly merge every occurrence (left to right, not
// overlapping) of the adjacent pair with the lowest rank. A heap of (rank, position) candidates
// over a linked list keeps it O(n log n); all candidates of one rank are taken before any new pair
// (which may rank lower) is considered, exactly as encoder.py finishes a pair before choosing the
// next.
void Gpt2BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  const auto n = static_cast<int32_t>(piece.size());
  if (n == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  thread_local BpeScratch scratch;
  // Named references, not a structured binding: lambdas cannot capture those before clang 16.
  auto& id = scratch.id;
  auto& next = scratch.next;
  auto& prev = scratch.prev;
  auto& alive = scratch.alive;
  auto& heap = scratch.heap;
  auto& batch = scratch.batch;
  id.resize(n);
  next.resize(n);
  prev.resize(n);
  alive.assign(n, 1);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    int32_t rank = rank_of_.find(pair_key(id[left], id[next[left]]));
    if (rank < 0) return;
    heap.emplace_back(rank, left);
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    const int32_t rank = heap.front().first;
    batch.clear();
    while (!heap.empty() && heap.front().first == rank) {
      batch.push_back(heap.front().second);  // increasing positions
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.pop_back();
    }
    const Merge& merge = merges_[rank];
    for (int32_t p : batch) {
      // Stale candidates (a symbol merged since) fail this test.
      if (!alive[p] || id[p] != merge.left || next[p] < 0 || id[next[p]] != merge.right) continue;
      int32_t q = next[p];
      id[p] = merge.merged;
      alive[q] = 0;
      next[p] = next[q];
      if (next[q] >= 0) prev[next[q]] = p;
      push(prev[p]);
      push(p);
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(id[i]);
}

void Gpt2BpeTokenizer::bpe_cached(std::string_view piece, std::vector<int32_t>* out) const {
  cache_.encode(piece, out, [this](std::string_view p, std::vector<int32_t>* o) { bpe(p, o); });
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (size_t pos = 0; pos < text.size();) {
    size_t end = scan_piece(text, pos);
    bpe_cached(text.substr(pos, end - pos), &ids);
    pos = end;
  }
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < static_cast<int32_t>(id_bytes_.size())) {
      out += id_bytes_[id];
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> make_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                           const std::string& merge_file) {
  auto tok = std::make_unique<Gpt2BpeTokenizer>();
  TROUPE_RETURN_IF_ERROR(tok->load(vocab_file, merge_file));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace troupe
