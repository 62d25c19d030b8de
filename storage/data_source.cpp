#include "troupe/data_source.hpp"

#include <algorithm>
#include <array>

#include "storage/gpt_dataset.hpp"
#include "storage/indexed_dataset.hpp"

namespace troupe {

namespace {

class IndexedDataSource final : public DataSource {
 public:
  IndexedDataSource(std::shared_ptr<const IndexedDataset> dataset, std::array<std::unique_ptr<GptWindows>, 3> windows,
                    int64_t seq_length, int64_t vocab_size)
      : dataset_(std::move(dataset)), windows_(std::move(windows)), seq_length_(seq_length), vocab_size_(vocab_size) {}

  int64_t seq_length() const override { return seq_length_; }
  int64_t num_windows(DataSplit split) const override {
    const auto& w = windows_[static_cast<int>(split)];
    return w ? w->num_windows() : 0;
  }
  Status read(DataSplit split, int64_t sample, int32_t* out) const override {
    const auto& w = windows_[static_cast<int>(split)];
    if (!w || w->num_windows() == 0)
      return Status::bad_input("the " + split_name(split) + " split of " + dataset_->prefix() +
                           " has no window of --seq-length + 1 tokens -- use a larger dataset or change --split");
    w->get(sample, out);
    for (int64_t i = 0; i <= seq_length_; ++i) {
      if (out[i] < 0 || out[i] >= vocab_size_)
        return Status::bad_input(dataset_->prefix() + " holds token id " + std::to_string(out[i]) +
                             ", outside the tokenizer's vocabulary of " + std::to_string(vocab_size_) +
                             " -- preprocess the data with the --tokenizer-type (and vocabulary) you train with");
    }
    return Status::ok();
  }
  std::string describe() const override {
    return dataset_->prefix() + ": " + std::to_string(dataset_->num_documents()) + " documents, " +
           std::to_string(dataset_->total_tokens()) + " tokens; windows train/valid/test " +
           std::to_string(num_windows(DataSplit::train)) + "/" + std::to_string(num_windows(DataSplit::validation)) +
           "/" + std::to_string(num_windows(DataSplit::test));
  }

 private:
  static std::string split_name(DataSplit s) {
    return s == DataSplit::train ? "training" : s == DataSplit::validation ? "validation" : "test";
  }
  std::shared_ptr<const IndexedDataset> dataset_;
  std::array<std::unique_ptr<GptWindows>, 3> windows_;
  int64_t seq_length_, vocab_size_;
};

class MockDataSource final : public DataSource {
 public:
  MockDataSource(int64_t vocab, int64_t seq, uint64_t seed) : vocab_(vocab), seq_(seq), seed_(seed) {}
  int64_t seq_length() const override { return seq_; }
  int64_t num_windows(DataSplit) const override { return int64_t{1} << 40; }
  Status read(DataSplit split, int64_t sample, int32_t* out) const override {
    uint64_t x = seed_ ^ (static_cast<uint64_t>(split) << 56) ^ (static_cast<uint64_t>(sample) * 0x9e3779b97f4a7c15ULL);
    for (int64_t i = 0; i <= seq_; ++i) {
      x += 0x9e3779b97f4a7c15ULL;  // splitmix64 stream
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      out[i] = static_cast<int32_t>(z % static_cast<uint64_t>(vocab_));
    }
    return Status::ok();
  }
  std::string describe() const override {
    return "mock data: uniform random tokens over a vocabulary of " + std::to_string(vocab_);
  }

 private:
  int64_t vocab_, seq_;
  uint64_t seed_;
};

// Every token must be a valid id of the model's vocabulary; checked once, up front, at the dtype's full
// width (an int64 id 2^32 + 7 is refused, not read as 7), so a dataset made with another tokenizer is
// refused before anything runs or is written (one pass over the .bin).
Status check_token_range(const IndexedDataset& ds, int64_t vocab_size) {
  const auto bad = ds.first_token_outside(vocab_size);
  if (!bad) return Status::ok();
  return Status::bad_input(ds.prefix() + ".bin holds token id " + std::to_string(bad->value) + " (token " +
                       std::to_string(bad->stream_offset) + " of the stream, in sequence " +
                       std::to_string(bad->sequence) + "), outside the tokenizer's vocabulary of " +
                       std::to_string(vocab_size) +
                       " -- preprocess the data with the --tokenizer-type (and vocabulary files) you train with");
}

}  // namespace

Result<std::shared_ptr<DataSource>> open_indexed_data(const std::string& prefix, const std::string& split,
                                                      int64_t seq_length, uint64_t seed, bool no_shuffle,
                                                      int64_t vocab_size) {
  auto ds = IndexedDataset::open(prefix);
  if (!ds) return ds.status();
  std::shared_ptr<const IndexedDataset> dataset = ds.value();
  TROUPE_RETURN_IF_ERROR(check_token_range(*dataset, vocab_size));
  auto ranges = split_token_ranges(*dataset, split);
  if (!ranges) return ranges.status();
  std::array<std::unique_ptr<GptWindows>, 3> windows;
  for (int s = 0; s < 3; ++s) {
    const auto [begin, end] = ranges.value()[s];
    const bool shuffle = s == 0 && !no_shuffle;
    windows[s] = std::make_unique<GptWindows>(dataset, begin, end, seq_length, seed, shuffle);
  }
  if (windows[0]->num_windows() == 0)
    return Status::bad_input(prefix + " has too few tokens in its training split (" +
                         std::to_string(ranges.value()[0].second - ranges.value()[0].first) +
                         ") for one window of --seq-length + 1 = " + std::to_string(seq_length + 1) +
                         " tokens -- use more data, a shorter --seq-length, or a larger training share in --split");
  return std::shared_ptr<DataSource>(
      std::make_shared<IndexedDataSource>(dataset, std::move(windows), seq_length, vocab_size));
}

Result<std::shared_ptr<DataSource>> open_indexed_data_unsplit(const std::string& prefix, int64_t seq_length,
                                                              int64_t vocab_size) {
  auto ds = IndexedDataset::open(prefix);
  if (!ds) return ds.status();
  std::shared_ptr<const IndexedDataset> dataset = ds.value();
  TROUPE_RETURN_IF_ERROR(check_token_range(*dataset, vocab_size));
  std::array<std::unique_ptr<GptWindows>, 3> windows;
  windows[0] = std::make_unique<GptWindows>(dataset, 0, dataset->total_tokens(), seq_length, 0, false);
  return std::shared_ptr<DataSource>(
      std::make_shared<IndexedDataSource>(dataset, std::move(windows), seq_length, vocab_size));
}

std::shared_ptr<DataSource> make_mock_data(int64_t vocab_size, int64_t seq_length, uint64_t seed) {
  return std::make_shared<MockDataSource>(vocab_size, seq_length, seed);
}

}  // namespace troupe
