// GPT windows (order, shuffling) and Megatron's document split.
#include <algorithm>
#include <numeric>
#include <set>

#include "storage/gpt_dataset.hpp"
#include "tests/test_util.hpp"

using troupe::GptWindows;
using troupe::IndexDType;
using troupe::IndexedDataset;

namespace {

// A dataset whose stream is 0, 1, 2, ... (mod 60000), in documents of the given token counts.
std::shared_ptr<IndexedDataset> counting_dataset(const troupe::test::TempDir& dir,
                                                 const std::vector<int>& doc_sizes) {
  auto b = troupe::IndexedDatasetBuilder::create(dir.str("ds"), IndexDType::u16);
  REQUIRE(b.is_ok());
  int32_t next = 0;
  for (int n : doc_sizes) {
    std::vector<int32_t> seq(n);
    for (auto& t : seq) t = next++ % 60000;
    REQUIRE((*b)->add_item(seq).is_ok());
    (*b)->end_document();
  }
  REQUIRE((*b)->finalize().is_ok());
  auto ds = IndexedDataset::open(dir.str("ds"));
  REQUIRE(ds.is_ok());
  return *ds;
}

std::vector<int64_t> epoch_order(const GptWindows& w, int64_t epoch) {
  std::vector<int64_t> order;
  for (int64_t p = 0; p < w.num_windows(); ++p)
    order.push_back(w.window_of(epoch * w.num_windows() + p));
  return order;
}

bool is_permutation_of_iota(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("gpt windows: without shuffle, window k is tokens [kS, kS+S]", "[gpt_dataset]") {
  troupe::test::TempDir dir;
  auto ds = counting_dataset(dir, {5, 17, 1, 40, 9, 33});  // 105 tokens
  for (int64_t S : {1, 4, 7, 16, 104, 105}) {
    for (int64_t begin : {0, 3}) {
      const int64_t end = ds->total_tokens();
      GptWindows w(ds, begin, end, S, /*seed=*/1, /*shuffle=*/false);
      INFO("S=" << S << " begin=" << begin);
      CHECK(w.num_windows() == std::max<int64_t>(0, (end - begin - 1) / S));
      std::vector<int32_t> out(S + 1);
      for (int64_t sample = 0; sample < 2 * w.num_windows(); ++sample) {
        w.get(sample, out.data());
        const int64_t k = sample % w.num_windows();
        for (int64_t i = 0; i <= S; ++i) CHECK(out[i] == begin + k * S + i);
      }
    }
  }
}

TEST_CASE("gpt windows: shuffled order is a per-epoch permutation fixed by the seed",
          "[gpt_dataset]") {
  troupe::test::TempDir dir;
  auto ds = counting_dataset(dir, {300, 211, 500});
  GptWindows a(ds, 0, ds->total_tokens(), 8, 1234, true);
  GptWindows a2(ds, 0, ds->total_tokens(), 8, 1234, true);
  GptWindows b(ds, 0, ds->total_tokens(), 8, 99, true);
  REQUIRE(a.num_windows() == (1011 - 1) / 8);
  auto e0 = epoch_order(a, 0), e1 = epoch_order(a, 1), e2 = epoch_order(a, 2);
  CHECK(is_permutation_of_iota(e0));
  CHECK(is_permutation_of_iota(e1));
  CHECK(is_permutation_of_iota(e2));
  CHECK(e0 != e1);
  CHECK(e1 != e2);
  std::vector<int64_t> identity(e0.size());
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(e0 != identity);
  CHECK(epoch_order(a2, 0) == e0);
  CHECK(epoch_order(a2, 1) == e1);
  CHECK(epoch_order(b, 0) != e0);
  // Going back to an earlier epoch gives the same order again.
  CHECK(epoch_order(a, 0) == e0);
  // The tokens are those of the window the order names.
  std::vector<int32_t> out(9);
  a.get(5, out.data());
  for (int i = 0; i <= 8; ++i) CHECK(out[i] == e0[5] * 8 + i);
}

TEST_CASE("gpt windows: the permutation is pinned (same on every platform)", "[gpt_dataset]") {
  // Golden values computed by an independent Python transcription of docs/DATA.md's definition
  // (splitmix64 + rejection-sampled Fisher-Yates); a change here changes every run's data order.
  CHECK(troupe::window_permutation(10, 1234, 0) == troupe::window_permutation(10, 1234, 0));
  std::vector<int64_t> p = troupe::window_permutation(10, 1234, 0);
  CHECK(p == std::vector<int64_t>{4, 7, 1, 8, 0, 3, 6, 2, 9, 5});
  CHECK(troupe::window_permutation(10, 1234, 1) ==
        std::vector<int64_t>{8, 7, 5, 1, 9, 3, 4, 0, 6, 2});
  CHECK(troupe::window_permutation(1, 5, 3) == std::vector<int64_t>{0});
  CHECK(troupe::window_permutation(0, 5, 3).empty());
}

TEST_CASE("split: Megatron's get_train_valid_test_split_ by hand", "[gpt_dataset]") {
  using Idx = std::array<int64_t, 4>;
  auto split = [](int64_t n, const std::string& s) {
    auto r = troupe::split_document_indices(n, s);
    REQUIRE(r.is_ok());
    return *r;
  };
  // 969,30,1 over 1000: 969, 30, 1 documents.
  CHECK(split(1000, "969,30,1") == Idx{0, 969, 999, 1000});
  // over 100: round(96.9)=97, round(3.0)=3, round(0.1)=0 -> [0,97,100,100], diff 0.
  CHECK(split(100, "969,30,1") == Idx{0, 97, 100, 100});
  // over 10: round(9.69)=10, round(0.3)=0, round(0.01)=0.
  CHECK(split(10, "969,30,1") == Idx{0, 10, 10, 10});
  // 1,1,1 over 10: 3,3,3 -> [0,3,6,9], diff -1 -> [0,4,7,10].
  CHECK(split(10, "1,1,1") == Idx{0, 4, 7, 10});
  // "1/1" over 5: weights .5,.5,0; round(2.5)=2 (ties to even) twice -> [0,2,4,4], diff -1 ->
  // [0,3,5,5].
  CHECK(split(5, "1/1") == Idx{0, 3, 5, 5});
  // 2,1,1 over 2: round(1)=1, round(.5)=0, round(.5)=0 -> [0,1,1,1], diff -1 -> [0,2,2,2].
  CHECK(split(2, "2,1,1") == Idx{0, 2, 2, 2});
  // 1,1 over 3: round(1.5)=2 twice -> [0,2,4,4], diff 1 -> [0,1,3,3].
  CHECK(split(3, "1,1") == Idx{0, 1, 3, 3});
  CHECK(split(7, "1") == Idx{0, 7, 7, 7});
  CHECK(split(0, "98,2,0") == Idx{0, 0, 0, 0});
  CHECK(split(50, " 90 , 5 , 5 ") == Idx{0, 46, 48, 50});  // [0,45,47,49] (2.5->2 twice), diff -1
}

// Megatron-LM's parse_and_normalize_split reads re.findall(r"[.0-9]+", split): whatever is not a
// digit or a dot separates weights, so the quotes a script leaves inside the value
// (examples/llama/train_llama3_8b_h100_fp8.sh builds "--split '99,1,0'" as one word) change nothing.
TEST_CASE("split: read as Megatron-LM reads it, separators and quotes ignored", "[gpt_dataset]") {
  using Idx = std::array<int64_t, 4>;
  auto split = [](int64_t n, const std::string& s) {
    auto r = troupe::split_document_indices(n, s);
    INFO("split '" << s << "'");
    REQUIRE(r.is_ok());
    return *r;
  };
  const Idx want = split(1000, "99,1,0");
  CHECK(want == Idx{0, 990, 1000, 1000});
  for (const char* s : {"'99,1,0'", "\"99,1,0\"", "99 1 0", "99/1/0", "99;1;0", "[99, 1, 0]", "99,,1,0"})
    CHECK(split(1000, s) == want);
  CHECK(split(10, "-1,1") == split(10, "1,1"));  // the minus is a separator to Megatron-LM too
  CHECK(split(10, "0.5,.5") == split(10, "1,1"));
}

TEST_CASE("split: malformed --split strings are errors", "[gpt_dataset]") {
  for (const char* s : {"", "a,b", "0,0,0", "1,2,3,4", "nan", "1.2.3,4", "'', ''"}) {
    auto r = troupe::split_document_indices(10, s);
    INFO("split '" << s << "'");
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains("--split"));
  }
}

TEST_CASE("split: token ranges follow the document split", "[gpt_dataset]") {
  troupe::test::TempDir dir;
  auto ds = counting_dataset(dir, {10, 20, 30, 40, 50, 60, 70, 80, 90, 100});
  auto r = troupe::split_token_ranges(*ds, "1,1,1");  // documents [0,4), [4,7), [7,10)
  REQUIRE(r.is_ok());
  CHECK((*r)[0] == std::pair<int64_t, int64_t>{0, 100});
  CHECK((*r)[1] == std::pair<int64_t, int64_t>{100, 280});
  CHECK((*r)[2] == std::pair<int64_t, int64_t>{280, 550});
  CHECK_FALSE(troupe::split_token_ranges(*ds, "x").is_ok());
}
