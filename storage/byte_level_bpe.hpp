// Private to storage/: what the two byte-level BPE tokenizers (GPT-2's vocab.json + merges.txt,
// storage/gpt2_bpe_tokenizer.cpp, and Hugging Face's tokenizer.json, storage/hf_tokenizer.cpp)
// share: OpenAI's byte alphabet and the cache of a pre-tokenised piece's ids. Their merge orders
// differ (GPT-2 applies every occurrence of the best pair at once, `tokenizers` one pair at a time),
// so each keeps its own bpe().
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe {

// OpenAI's bytes_to_unicode: printable Latin-1 bytes spell themselves, the other 68 map, in byte
// order, to U+0100, U+0101, ...
std::array<int32_t, 256> bytes_to_unicode();

// piece -> ids, sharded so that worker threads rarely contend; bounded (a full shard is cleared and
// refills quickly). Thread-safe.
class PieceCache {
 public:
  // Appends the ids of `piece` to *out: cached, or computed by bpe(piece, out) and kept.
  template <class Bpe>
  void encode(std::string_view piece, std::vector<int32_t>* out, Bpe&& bpe) const {
    if (piece.size() > kMaxCachedPiece) return bpe(piece, out);
    Shard& shard = shards_[std::hash<std::string_view>{}(piece) % kShards];
    {
      std::lock_guard<std::mutex> lock(shard.mutex);
      auto it = shard.map.find(piece);
      if (it != shard.map.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out->size();
    bpe(piece, out);
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.map.size() >= kMaxShardEntries) shard.map.clear();
    shard.map.emplace(std::string(piece), std::vector<int32_t>(out->begin() + first, out->end()));
  }

 private:
  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxCachedPiece = 64;  // bytes; longer pieces are rare, not worth keeping
  static constexpr size_t kMaxShardEntries = 1 << 14;
  // Heterogeneous lookup: find a string_view without building a std::string.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace troupe
