// GPT training samples over an indexed dataset (docs/DATA.md, "Samples").
//
// The token stream is every document concatenated in order (with --append-eod each ends in EOD).
// Over a range [token_begin, token_end) of it, with S = seq_length, there are
//   n = max(0, (token_end - token_begin - 1) / S)
// windows of S+1 tokens; window k covers stream tokens [token_begin + k*S, token_begin + k*S + S]
// (inclusive), so consecutive windows overlap by one token (input = first S, label = last S), as in
// Megatron. Windows ignore document boundaries.
//
// Sample s (any s >= 0) is in epoch e = s / n at position p = s % n. Without shuffling it is window
// p. With shuffling it is window perm_e[p], where perm_e is a Fisher-Yates permutation of 0..n-1
// drawn from a counter-based generator keyed by (seed, e) (splitmix64, unbiased bounded integers),
// so every platform and every run produces the same order, and each epoch has its own order.
//
// Thread safety: get() may be called from several threads; the current epoch's permutation is
// cached under a mutex (calls that alternate between epochs rebuild it each time; read epochs in
// order).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/status.hpp"
#include "storage/indexed_dataset.hpp"

namespace troupe {

class GptWindows {
 public:
  // Preconditions (checked): 0 <= token_begin <= token_end <= dataset->total_tokens();
  // seq_length >= 1.
  GptWindows(std::shared_ptr<const IndexedDataset> dataset, int64_t token_begin, int64_t token_end,
             int64_t seq_length, uint64_t seed, bool shuffle);

  int64_t num_windows() const { return num_windows_; }
  int64_t seq_length() const { return seq_length_; }

  // The window sample `sample` maps to (see above). Precondition (checked): num_windows() > 0.
  int64_t window_of(int64_t sample) const;
  // Writes sample `sample`'s S+1 tokens to out[0..S].
  void get(int64_t sample, int32_t* out) const;

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  int64_t token_begin_;
  int64_t seq_length_;
  uint64_t seed_;
  bool shuffle_;
  int64_t num_windows_;
  mutable std::mutex mutex_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> permutation_;  // (num_windows) of cached_epoch_
};

// The permutation of 0..n-1 GptWindows uses for (seed, epoch); exposed for tests and docs.
std::vector<int64_t> window_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Megatron's --split: "969,30,1" (one to three non-negative weights, missing ones 0, read as
// Megatron-LM reads them: every run of digits and dots a weight, anything else a separator, so
// "969/30/1" and a quoted "'99,1,0'" work too) divides the DOCUMENTS by get_train_valid_test_split_'s rule: normalise
// the weights; index[0] = 0, index[i+1] = index[i] + round(w_i * num_docs) (Python's round, ties to even); subtract
// diff = index[3] - num_docs from index[1..3]. Returns the stream token ranges [begin, end) of the train, validation
// and test documents. A malformed string is an error naming --split.
Result<std::array<int64_t, 4>> split_document_indices(int64_t num_documents,
                                                      const std::string& split);
Result<std::array<std::pair<int64_t, int64_t>, 3>> split_token_ranges(const IndexedDataset& dataset,
                                                                      const std::string& split);

}  // namespace troupe
