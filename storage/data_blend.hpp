// Megatron's data blends (docs/DATA.md, "Blends"): --data-path (and --train-data-path,
// --valid-data-path, --test-data-path) as a list of dataset prefixes, or of WEIGHT PREFIX pairs,
// and the interleaving of several datasets into one stream of samples.
//
// Parsing (parse_data_blend), Megatron's get_blend_from_list (megatron/core/datasets/utils.py):
// every item is first split at whitespace (Megatron-DeepSpeed scripts pass DATA_PATH="0.5 a 0.5 b"
// quoted or not), except an item that names an existing dataset (ITEM.idx is a file), which stays
// whole (a prefix with a space in it). Then:
//   - an odd number of items: every item is a prefix, no weights;
//   - an even number: pairs WEIGHT PREFIX when every first item of a pair is a number, else every
//     item is a prefix (no weights) when none is; a mix is an error (Megatron asserts).
// Without weights the datasets are weighed by their size (the windows each has in the split, as
// Megatron weighs by len(dataset)). Weights must be finite and >= 0 and not all 0. Every problem
// is reported at once.
//
// Blending (BlendIndex), Megatron's build_blending_indices (megatron/core/datasets/helpers.cpp):
// with the weights w normalised (numpy's normalize applied twice, as Megatron-LM's builder and
// BlendedDataset each apply it; sums as numpy.sum computes them: pairwise), sample i of the blend
// comes from dataset
//     d(i) = argmax_d  w[d] * max(i, 1) - taken_d(i)       (ties: the lowest d)
// where taken_d(i) counts the samples taken from d before i; it is that dataset's sample taken_d(i).
// The rule depends only on i and the counts, so sample i of the blend is the same whatever the
// blend's length: Megatron sizes the blend to the samples it trains, troupe computes it on demand
// for any i (so resuming at consumed samples continues the same stream). Megatron also sizes each
// component to ceil(ceil(w*N) * 1.005) samples; troupe's components repeat their epochs without
// end (storage/gpt_dataset.hpp), so no surplus is needed and none changes the order.
//
// Thread safety: BlendIndex::at may be called from several threads (a mutex guards its caches).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/status.hpp"

namespace troupe {

struct DataBlend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // as given (not normalised); empty: no weights, weigh by size
};

// At most this many datasets in one blend (Megatron: fewer than 32767, dataset_index is int16).
constexpr size_t kMaxBlendDatasets = 32766;

// Whether the items name anything (an item of whitespace only, e.g. --data-path "", names nothing).
bool blend_given(const std::vector<std::string>& items);

// `flag` names the flag in messages ("--data-path"). An empty list is an empty blend (no prefix).
Result<DataBlend> parse_data_blend(const std::vector<std::string>& items, const std::string& flag);

// numpy.sum of a float64 array (pairwise summation, blocks of 8 accumulators up to 128 items), and
// Megatron's normalize: w / numpy.sum(w).
double numpy_sum(const std::vector<double>& values);
std::vector<double> megatron_normalize(const std::vector<double>& weights);

class BlendIndex {
 public:
  // `weights` as Megatron's BlendedDataset receives them (normalised, or raw sizes: they are
  // normalised once more here, as BlendedDataset does). Preconditions (checked): 1 to
  // kMaxBlendDatasets finite weights >= 0, their sum > 0.
  explicit BlendIndex(std::vector<double> weights);

  size_t num_datasets() const { return weights_.size(); }
  const std::vector<double>& weights() const { return weights_; }
  // (dataset, the sample of that dataset) for blend sample `sample` >= 0.
  std::pair<int32_t, int64_t> at(int64_t sample) const;

 private:
  static constexpr int64_t kBlock = 4096;  // samples between snapshots of the counts
  void decode_block(int64_t block) const;

  std::vector<double> weights_;
  mutable std::mutex mutex_;
  // snapshots_[b]: the counts taken_d before sample b * kBlock, for every block reached so far.
  mutable std::vector<std::vector<int64_t>> snapshots_;
  mutable int64_t cached_block_ = -1;
  mutable std::vector<int32_t> cached_dataset_;        // (kBlock)
  mutable std::vector<int64_t> cached_dataset_sample_;  // (kBlock)
};

}  // namespace troupe
