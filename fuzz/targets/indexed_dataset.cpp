// A Megatron MMIDIDX dataset (.idx + .bin, split_two's layout: the .idx length first) opened by
// IndexedDataset::open and read the way training and evaluation read it: every array, the whole
// stream, the token range check, the --split ranges, shuffled windows, and the data sources of
// `troupe train` (open_indexed_data) and `troupe eval` (open_indexed_data_unsplit).
#include "storage/indexed_dataset.hpp"

#include <algorithm>
#include <vector>

#include "troupe/data_source.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/gpt_dataset.hpp"

namespace troupe::fuzz {

Status indexed_dataset(const uint8_t* data, size_t size) {
  const auto [idx, bin] = split_two(data, size);
  write_scratch("ds.idx", idx);
  write_scratch("ds.bin", bin);
  const std::string prefix = scratch_dir() + "/ds";
  auto opened = IndexedDataset::open(prefix);
  if (!opened) return opened.status();
  const IndexedDataset& ds = **opened;

  // The arrays and the stream: every access stays inside the mappings (ASan would see it).
  TROUPE_CHECK(static_cast<int64_t>(ds.sizes().size()) == ds.num_sequences(), "sizes()");
  TROUPE_CHECK(static_cast<int64_t>(ds.doc_indices().size()) == ds.num_documents() + 1, "doc_idx");
  TROUPE_CHECK(ds.document_token_offset(ds.num_documents()) == ds.total_tokens(), "stream end");
  std::vector<int32_t> stream(static_cast<size_t>(ds.total_tokens()));
  ds.read_tokens(0, ds.total_tokens(), stream.data());
  const auto outside = ds.first_token_outside(257);
  const bool all_bytes =
      std::all_of(stream.begin(), stream.end(), [](int32_t t) { return t >= 0 && t < 257; });
  TROUPE_CHECK(all_bytes == !outside.has_value(), "first_token_outside disagrees with read_tokens");
  if (outside)
    TROUPE_CHECK(ds.sequence_at(outside->stream_offset) < ds.num_sequences(), "sequence");

  for (const char* split : {"969,30,1", "1,1,1", "0,0,1"}) {
    auto ranges = split_token_ranges(ds, split);
    TROUPE_CHECK(ranges.is_ok(), "a valid --split failed on an opened dataset");
  }
  const int64_t seq_length = 1 + static_cast<int64_t>(size % 7);
  std::vector<int32_t> window(static_cast<size_t>(seq_length) + 1);
  GptWindows windows(*opened, 0, ds.total_tokens(), seq_length, size, /*shuffle=*/true);
  for (int64_t s = 0; s < std::min<int64_t>(windows.num_windows() * 2, 16); ++s)
    windows.get(s, window.data());

  // What train and eval open; read a few samples of each split.
  for (const int64_t vocab : {int64_t{257}, int64_t{50257}, int64_t{2147483647}}) {
    auto train = open_indexed_data(prefix, "969,30,1", seq_length, 1234, false, vocab);
    if (train) {
      for (DataSplit split : {DataSplit::train, DataSplit::validation, DataSplit::test}) {
        for (int64_t s = 0; s < std::min<int64_t>((*train)->num_windows(split), 4); ++s)
          (void)(*train)->read(split, s, window.data());
      }
    }
    auto eval = open_indexed_data_unsplit(prefix, seq_length, vocab);
    if (eval && (*eval)->num_windows(DataSplit::train) > 0)
      (void)(*eval)->read(DataSplit::train, 0, window.data());
  }
  return Status::ok();
}

}  // namespace troupe::fuzz
