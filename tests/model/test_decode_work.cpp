// A parallel decoder's feed on the wire (model/decode_work.hpp): random feeds round-trip, the
// micro-batch split covers every sequence in order with none empty, and the parser refuses what a
// rank must not run (every cut of a valid feed, tokens outside the vocabulary, negative ids, bad
// micro-batches, trailing bytes), naming the problem.
#include <catch2/catch.hpp>
#include <random>

#include "model/decode_work.hpp"
#include "troupe/model_config.hpp"

using namespace troupe;

namespace {

DecodeWork random_work(std::mt19937_64& rng, int64_t vocab) {
  DecodeWork w;
  std::uniform_int_distribution<int> small(0, 5), id(0, 40), len(1, 9);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  for (int i = small(rng); i > 0; --i) w.ops.push_back({static_cast<SlotOp::Kind>(small(rng) % 3), id(rng), id(rng)});
  const int S = small(rng);
  w.rows.row0.assign(S > 0 ? 1 : 0, 0);
  for (int i = 0; i < S; ++i) {
    w.rows.ids.push_back(id(rng));
    w.every.push_back(static_cast<uint8_t>(small(rng) % 2));
    std::vector<int32_t> t(static_cast<size_t>(len(rng)));
    for (int32_t& x : t) x = tok(rng);
    w.rows.row0.push_back(w.rows.row0.back() + static_cast<int64_t>(t.size()));
    w.tokens.push_back(std::move(t));
  }
  w.group_end = split_micro_batches(w.rows.row0, 1 + small(rng));
  return w;
}

}  // namespace

TEST_CASE("decode work: random feeds round-trip; the micro-batches cover the feed in order", "[decoder]") {
  std::mt19937_64 rng(0xdec0de);
  const int64_t vocab = 97;
  for (int trial = 0; trial < 300; ++trial) {
    const DecodeWork w = random_work(rng, vocab);
    INFO("trial " << trial);
    if (!w.rows.ids.empty()) {
      REQUIRE(w.group_end.back() == w.rows.ids.size());
      for (size_t k = 0; k < w.group_end.size(); ++k) REQUIRE(w.group_end[k] > (k == 0 ? 0 : w.group_end[k - 1]));
    } else {
      REQUIRE(w.group_end.empty());
    }
    const std::string bytes = encode_decode_work(w);
    auto back = parse_decode_work(bytes, vocab);
    REQUIRE(back);
    const DecodeWork& b = back.value();
    REQUIRE(b.ops.size() == w.ops.size());
    for (size_t i = 0; i < w.ops.size(); ++i)
      REQUIRE((b.ops[i].kind == w.ops[i].kind && b.ops[i].id == w.ops[i].id && b.ops[i].from == w.ops[i].from));
    REQUIRE(b.rows.ids == w.rows.ids);
    REQUIRE(b.rows.row0 == w.rows.row0);
    REQUIRE(b.tokens == w.tokens);
    REQUIRE(b.every == w.every);
    REQUIRE(b.group_end == w.group_end);
    size_t rows = 0;
    for (size_t i = 0; i < w.tokens.size(); ++i) rows += w.every[i] ? w.tokens[i].size() : 1;
    REQUIRE(decode_logits_count(w, vocab) == rows * vocab);
    REQUIRE(encode_decode_work(b) == bytes);
    // Every proper prefix is refused (nothing read past the end, nothing accepted half).
    for (size_t cut = 0; cut < bytes.size(); ++cut) REQUIRE_FALSE(parse_decode_work(bytes.substr(0, cut), vocab));
    REQUIRE_FALSE(parse_decode_work(bytes + '\0', vocab));
  }
}

TEST_CASE("decode work: what a rank must not run is refused, naming it", "[decoder]") {
  DecodeWork w;
  w.ops = {{SlotOp::open, 3, 0}};
  w.rows.ids = {3, 5};
  w.rows.row0 = {0, 2, 3};
  w.tokens = {{1, 2}, {60}};
  w.every = {0, 1};
  w.group_end = {1, 2};
  REQUIRE(parse_decode_work(encode_decode_work(w), 61));
  auto refused = [](const DecodeWork& bad, int64_t vocab, const std::string& why) {
    auto r = parse_decode_work(encode_decode_work(bad), vocab);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.status().message(), Catch::Contains(why));
  };
  refused(w, 60, "token 60 outside the vocabulary");
  DecodeWork neg = w;
  neg.rows.ids[1] = -2;
  refused(neg, 61, "negative sequence id");
  DecodeWork kind = w;
  kind.ops[0].kind = static_cast<SlotOp::Kind>(7);
  refused(kind, 61, "sequence change of kind 7");
  DecodeWork groups = w;
  groups.group_end = {2, 2};
  refused(groups, 61, "micro-batch 1 ends at sequence 2");
  groups.group_end = {1};
  refused(groups, 61, "do not end at its last sequence");
  DecodeWork empty = w;
  empty.tokens[0].clear();
  refused(empty, 61, "sequence 0 has no tokens");
  REQUIRE_FALSE(parse_decode_work("TDW2", 61));
  // A count larger than the bytes could hold is refused before anything is allocated.
  std::string huge = encode_decode_work(DecodeWork{});
  huge[4] = huge[5] = huge[6] = huge[7] = '\xff';
  auto r = parse_decode_work(huge, 61);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.status().message(), Catch::Contains("4294967295 sequence changes"));
}

TEST_CASE("decode work: a follower's book checks feeds as rank 0 does and grows the sequences", "[decoder]") {
  GptConfig m;
  m.num_layers = 1;
  m.hidden_size = 8;
  m.num_attention_heads = 2;
  m.seq_length = 8;
  m.max_position_embeddings = 10;
  m.vocab_size = 50;
  REQUIRE(m.validate().is_ok());
  FeedBook book(m);
  auto feed = [](std::vector<SlotOp> ops, std::vector<int> ids, std::vector<std::vector<int32_t>> tokens) {
    DecodeWork w;
    w.ops = std::move(ops);
    w.rows.ids = std::move(ids);
    w.tokens = std::move(tokens);
    w.every.assign(w.tokens.size(), 0);
    w.rows.row0.assign(w.tokens.empty() ? 0 : 1, 0);
    for (const auto& t : w.tokens) w.rows.row0.push_back(w.rows.row0.back() + static_cast<int64_t>(t.size()));
    w.group_end = split_micro_batches(w.rows.row0, 1);
    return w;
  };
  // Lengths grow with every feed: 6 + 3 fit the 10 positions, one more row then does not.
  REQUIRE(book.accept(feed({{SlotOp::open, 4, 0}}, {4}, {{1, 2, 3, 4, 5, 6}})));
  REQUIRE(book.accept(feed({}, {4}, {{7, 8, 9}})));
  CHECK(book.length(4) == 9);
  auto too_long = book.accept(feed({}, {4}, {{1, 2}}));
  REQUIRE_FALSE(too_long);
  CHECK_THAT(too_long.message(), Catch::Contains("positions"));
  CHECK(book.length(4) == 9);  // a refused feed changes nothing
  // A copy holds its source's tokens; closing ends a sequence; reopening an open id is refused.
  REQUIRE(book.accept(feed({{SlotOp::copy, 2, 4}}, {2}, {{5}})));
  CHECK(book.length(2) == 10);
  REQUIRE(book.accept(feed({{SlotOp::close, 4, 0}}, {}, {})));
  CHECK_FALSE(book.is_open(4));
  CHECK_FALSE(book.accept(feed({}, {4}, {{1}})));                      // closed
  CHECK_FALSE(book.accept(feed({{SlotOp::open, 2, 0}}, {}, {})));      // already open
  CHECK_FALSE(book.accept(feed({{SlotOp::copy, 7, 4}}, {}, {})));      // from a closed one
  CHECK_FALSE(book.accept(feed({{SlotOp::close, 9, 0}}, {}, {})));     // never opened
  CHECK_FALSE(book.accept(feed({{SlotOp::open, 3, 0}}, {3, 3}, {{1}, {2}})));  // a sequence twice
  CHECK_FALSE(book.is_open(3));
}
