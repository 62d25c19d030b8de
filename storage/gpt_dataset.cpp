#include "storage/gpt_dataset.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>

namespace troupe {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's output function.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Draw i of the stream keyed by `key` is mix64(key + (i + 1) * kGolden): splitmix64 started at
// `key`.
class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : state_(key) {}
  uint64_t next() {
    state_ += kGolden;
    return mix64(state_);
  }
  // Uniform in [0, bound) without modulo bias: reject draws below 2^64 mod bound.
  uint64_t bounded(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<int64_t> window_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  TROUPE_CHECK(n >= 0 && epoch >= 0, "window_permutation needs n >= 0 and epoch >= 0");
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  CounterRng rng(mix64(mix64(seed) ^ (static_cast<uint64_t>(epoch) * kGolden + kGolden)));
  for (int64_t i = n - 1; i >= 1; --i) {
    auto j = static_cast<int64_t>(rng.bounded(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

GptWindows::GptWindows(std::shared_ptr<const IndexedDataset> dataset, int64_t token_begin,
                       int64_t token_end, int64_t seq_length, uint64_t seed, bool shuffle)
    : dataset_(std::move(dataset)),
      token_begin_(token_begin),
      seq_length_(seq_length),
      seed_(seed),
      shuffle_(shuffle) {
  TROUPE_CHECK(dataset_ != nullptr, "GptWindows needs a dataset");
  TROUPE_CHECK(seq_length >= 1, "seq_length must be at least 1");
  TROUPE_CHECK(
      0 <= token_begin && token_begin <= token_end && token_end <= dataset_->total_tokens(),
      "GptWindows token range must lie inside the dataset's stream");
  num_windows_ = std::max<int64_t>(0, (token_end - token_begin - 1) / seq_length);
}

int64_t GptWindows::window_of(int64_t sample) const {
  TROUPE_CHECK(num_windows_ > 0,
               "no windows: the token range is shorter than seq_length + 1 tokens");
  TROUPE_CHECK(sample >= 0, "sample index must be non-negative");
  const int64_t epoch = sample / num_windows_, position = sample % num_windows_;
  if (!shuffle_) return position;
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch != cached_epoch_) {
    permutation_ = window_permutation(num_windows_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return permutation_[position];
}

void GptWindows::get(int64_t sample, int32_t* out) const {
  const int64_t window = window_of(sample);
  dataset_->read_tokens(token_begin_ + window * seq_length_, seq_length_ + 1, out);
}

Result<std::array<int64_t, 4>> split_document_indices(int64_t num_documents,
                                                      const std::string& split) {
  const std::string fix =
      " -- pass up to three non-negative weights for train, validation and test, "
      "e.g. --split 969,30,1";
  // Megatron-LM's parse_and_normalize_split: every run of digits and dots is a weight
  // (re.findall(r"[.0-9]+")), anything else separates them, so "'99,1,0'" (quotes a script left in)
  // and "99/1/0" read as 99, 1, 0; a run that is no number ("1.2.3") is an error, as float() raises.
  std::vector<double> weights;
  for (size_t i = 0; i < split.size();) {
    if (!(std::isdigit(static_cast<unsigned char>(split[i])) || split[i] == '.')) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < split.size() && (std::isdigit(static_cast<unsigned char>(split[end])) || split[end] == '.')) ++end;
    const std::string field = split.substr(i, end - i);
    char* stop = nullptr;
    const double w = std::strtod(field.c_str(), &stop);
    if (*stop != '\0' || !std::isfinite(w))
      return Status::bad_input("--split '" + split + "': '" + field + "' is not a number" + fix);
    weights.push_back(w);
    i = end;
  }
  if (weights.size() > 3) {
    return Status::bad_input("--split '" + split + "' has " + std::to_string(weights.size()) +
                         " weights" + fix);
  }
  weights.resize(3, 0.0);
  const double sum = weights[0] + weights[1] + weights[2];
  if (!(sum > 0)) return Status::bad_input("--split '" + split + "' weights sum to 0" + fix);

  std::array<int64_t, 4> index{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    // Python's round(): nearest, ties to even (nearbyint under the default rounding mode).
    index[i + 1] =
        index[i] + static_cast<int64_t>(std::nearbyint(weights[i] / sum * double(num_documents)));
  }
  const int64_t diff = index[3] - num_documents;
  for (int i = 1; i < 4; ++i) index[i] -= diff;
  // Megatron asserts the result; the rule keeps it ordered except in degenerate cases, clamp those.
  for (int i = 1; i < 4; ++i) index[i] = std::clamp(index[i], index[i - 1], num_documents);
  return index;
}

Result<std::array<std::pair<int64_t, int64_t>, 3>> split_token_ranges(const IndexedDataset& dataset,
                                                                      const std::string& split) {
  auto index = split_document_indices(dataset.num_documents(), split);
  if (!index) return index.status();
  std::array<std::pair<int64_t, int64_t>, 3> ranges;
  for (int i = 0; i < 3; ++i) {
    ranges[i] = {dataset.document_token_offset((*index)[i]),
                 dataset.document_token_offset((*index)[i + 1])};
  }
  return ranges;
}

}  // namespace troupe
