// One feed of a parallel decoder (actors/decode_actors.hpp) as every shard rank receives it: the
// sequence changes to apply first, the feed's rows and tokens, which sequences want every row's
// logits, and the micro-batches the pipeline cuts it into. In one process it travels as a pointer;
// between processes (a decoder whose ranks are processes of a `troupe launch`) rank 0 encodes it
// and broadcasts the bytes, and every other rank parses them.
//
// The encoding (little-endian, as the ranks' hosts are):
//   "TDW1"  u32 ops     then per op: u8 kind (0 open, 1 close, 2 copy), i32 id, i32 from
//           u32 seqs    then per sequence: i32 id, u8 every, u32 count, i32 tokens[count]
//           u32 groups  then u32 group_end[groups]
// The parser takes bytes from another process as hostile (fuzz/targets/decode_work.cpp): counts are
// checked against the bytes left before anything is allocated, ids are non-negative, tokens lie in
// the vocabulary, micro-batches are non-empty and end at the last sequence, nothing trails. Whether
// the ids name open sequences and the rows fit the positions is the receiver's SequenceBook's
// question (plan_feed), as it is rank 0's.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/decoder_shard.hpp"
#include "troupe/status.hpp"

namespace troupe {

// A change to the sequences, applied by every rank before the feed it travels with.
struct SlotOp {
  enum Kind : uint8_t { open, close, copy } kind = open;
  int id = 0, from = 0;  // copy: `from` into `id`
};

struct DecodeWork {
  std::vector<SlotOp> ops;
  DecodeRows rows;  // empty: the ops only
  std::vector<std::vector<int32_t>> tokens;
  std::vector<uint8_t> every;      // per sequence: the logits of every new row, or of its last
  std::vector<size_t> group_end;   // micro-batch k holds sequences [group_end[k-1], group_end[k])
};

// Up to `micro_batches` groups of about equal rows, each at least one sequence (row0: the feed's
// DecodeRows::row0). Empty for no sequences.
std::vector<size_t> split_micro_batches(const std::vector<int64_t>& row0, int micro_batches);

std::string encode_decode_work(const DecodeWork& work);
// The work `bytes` encode, rows laid out from the token counts; bad input naming the first problem.
Result<DecodeWork> parse_decode_work(std::string_view bytes, int64_t vocab_size);

// How many logits the collecting rank returns for `work`: per sequence, (every ? its rows : 1) x vocab.
size_t decode_logits_count(const DecodeWork& work, int64_t vocab_size);

// Another process's view of rank 0's sequences: accept() checks a parsed feed as rank 0 checked it
// (its sequence changes against the open sequences -- open a new id, close or copy an open one --
// then plan_feed: open ids, each once, within the model's positions) and, when it passes, applies
// the changes and grows the sequences by their rows. Nothing changes when it fails.
class FeedBook {
 public:
  explicit FeedBook(GptConfig config) : config_(std::move(config)) {}
  Status accept(const DecodeWork& work);
  bool is_open(int id) const { return length_.count(id) != 0; }
  int64_t length(int id) const { return length_.at(id); }

 private:
  GptConfig config_;
  std::map<int, int64_t> length_;  // open sequences' tokens so far
};

}  // namespace troupe
