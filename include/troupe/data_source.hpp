// Where training and evaluation windows come from: a Megatron indexed dataset split into train /
// validation / test by documents (storage/gpt_dataset.hpp), or synthetic tokens (--mock-data, as
// Megatron's). Thread-safe for concurrent reads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

enum class DataSplit : uint8_t { train = 0, validation = 1, test = 2 };

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual int64_t seq_length() const = 0;
  // Windows in the split; 0 when the split is empty (too few documents).
  virtual int64_t num_windows(DataSplit split) const = 0;
  // Fills out[0 .. seq_length] with window `sample` of the split (samples past the end start new
  // epochs). Fails when a token is outside the vocabulary the model was built for.
  virtual Status read(DataSplit split, int64_t sample, int32_t* out) const = 0;
  virtual std::string describe() const = 0;
};

// The training split is shuffled with `seed` unless no_shuffle; validation and test are read in order.
Result<std::shared_ptr<DataSource>> open_indexed_data(const std::string& prefix, const std::string& split,
                                                      int64_t seq_length, uint64_t seed, bool no_shuffle,
                                                      int64_t vocab_size);
// Every window of the whole dataset in order (no split, no shuffle), as `troupe eval` reads it:
// window k covers tokens [k*S, k*S+S].
Result<std::shared_ptr<DataSource>> open_indexed_data_unsplit(const std::string& prefix, int64_t seq_length,
                                                              int64_t vocab_size);
// Megatron's data blends and per-split data paths (docs/DATA.md, "Blends"). data_path holds
// --data-path's items: one prefix, several prefixes (weighed by their sizes), or WEIGHT PREFIX
// pairs; each dataset is split by `split` and the blend of each split interleaves them by weight
// (Megatron's BlendedDataset). With data_path empty, train/valid/test_data_path are each a blend
// of whole datasets (`split` unused); an empty one leaves that split empty. One prefix without a
// weight is open_indexed_data. Every problem (a malformed blend, a missing or unreadable dataset, a
// token outside the vocabulary, a weighted dataset with no training window) is reported at once.
struct DataPaths {
  std::vector<std::string> data_path;
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
};
Result<std::shared_ptr<DataSource>> open_blended_data(const DataPaths& paths, const std::string& split,
                                                      int64_t seq_length, uint64_t seed, bool no_shuffle,
                                                      int64_t vocab_size);
// Uniform random tokens from the seed, a fixed number of windows per split.
std::shared_ptr<DataSource> make_mock_data(int64_t vocab_size, int64_t seq_length, uint64_t seed);

}  // namespace troupe
