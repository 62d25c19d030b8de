#include "troupe/data_source.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include "storage/data_blend.hpp"
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

// One dataset of a blend: its windows in each split (null where the split is not drawn from it).
struct BlendMember {
  std::shared_ptr<const IndexedDataset> dataset;
  std::array<std::unique_ptr<GptWindows>, 3> windows;
};

// Each split: a BlendIndex over the members with a positive weight in it (storage/data_blend.hpp).
class BlendedDataSource final : public DataSource {
 public:
  struct Split {
    std::vector<size_t> members;        // member of each blend dataset index
    std::unique_ptr<BlendIndex> index;  // null: the split is empty
    int64_t windows = 0;                // sum of the members' windows (one epoch of each)
  };

  BlendedDataSource(std::vector<BlendMember> members, std::array<Split, 3> splits, int64_t seq_length,
                    int64_t vocab_size, std::string how)
      : members_(std::move(members)),
        splits_(std::move(splits)),
        seq_length_(seq_length),
        vocab_size_(vocab_size),
        how_(std::move(how)) {}

  int64_t seq_length() const override { return seq_length_; }
  int64_t num_windows(DataSplit split) const override { return splits_[static_cast<int>(split)].windows; }
  Status read(DataSplit split, int64_t sample, int32_t* out) const override {
    const Split& s = splits_[static_cast<int>(split)];
    if (!s.index || s.windows == 0)
      return Status::bad_input("the " + split_name(split) +
                               " blend has no window of --seq-length + 1 tokens -- give it larger datasets");
    const auto [d, member_sample] = s.index->at(sample);
    const BlendMember& m = members_[s.members[static_cast<size_t>(d)]];
    m.windows[static_cast<int>(split)]->get(member_sample, out);
    for (int64_t i = 0; i <= seq_length_; ++i) {
      if (out[i] < 0 || out[i] >= vocab_size_)
        return Status::bad_input(m.dataset->prefix() + " holds token id " + std::to_string(out[i]) +
                                 ", outside the tokenizer's vocabulary of " + std::to_string(vocab_size_) +
                                 " -- preprocess the data with the --tokenizer-type you train with");
    }
    return Status::ok();
  }
  std::string describe() const override {
    std::string out = how_ + " of " + std::to_string(members_.size()) + " datasets; windows train/valid/test " +
                      std::to_string(num_windows(DataSplit::train)) + "/" +
                      std::to_string(num_windows(DataSplit::validation)) + "/" +
                      std::to_string(num_windows(DataSplit::test));
    for (int s = 0; s < 3; ++s) {
      const Split& split = splits_[s];
      if (!split.index) continue;
      out += std::string("; ") + (s == 0 ? "train" : s == 1 ? "valid" : "test") + ":";
      for (size_t k = 0; k < split.members.size(); ++k) {
        char weight[32];
        std::snprintf(weight, sizeof weight, "%.4g", split.index->weights()[k]);
        out += std::string(k ? "," : "") + " " + weight + " " + members_[split.members[k]].dataset->prefix();
      }
    }
    return out;
  }

 private:
  static std::string split_name(DataSplit s) {
    return s == DataSplit::train ? "training" : s == DataSplit::validation ? "validation" : "test";
  }
  std::vector<BlendMember> members_;
  std::array<Split, 3> splits_;
  int64_t seq_length_, vocab_size_;
  std::string how_;
};

// Opens every dataset of `blend`, each problem collected in `problems`.
std::vector<std::shared_ptr<const IndexedDataset>> open_members(const DataBlend& blend, int64_t vocab_size,
                                                                std::vector<std::string>* problems) {
  std::vector<std::shared_ptr<const IndexedDataset>> out;
  for (const std::string& prefix : blend.prefixes) {
    auto ds = IndexedDataset::open(prefix);
    if (!ds) {
      problems->push_back(ds.status().message());
      out.push_back(nullptr);
      continue;
    }
    if (Status st = check_token_range(**ds, vocab_size); !st) problems->push_back(st.message());
    out.push_back(ds.value());
  }
  return out;
}

// The split's blend over members [first, first + blend size) of `all`: weights as given, or the
// members' windows in the split (Megatron weighs an unweighted list by len(dataset)). A member
// without a window in the split is left out of it (Megatron could not read it; note that a member
// of weight 0 stays in: the rule picks it on ties, as Megatron does); for training that is an error
// when its weight is positive.
BlendedDataSource::Split make_split(const std::vector<BlendMember>& all, size_t first, const DataBlend& blend,
                                    int split, const std::string& flag, std::vector<std::string>* problems) {
  BlendedDataSource::Split out;
  std::vector<double> weights;
  for (size_t k = 0; k < blend.prefixes.size(); ++k) {
    const BlendMember& m = all[first + k];
    const int64_t windows = m.windows[split] ? m.windows[split]->num_windows() : 0;
    if (windows == 0) {
      if (split == 0 && !blend.weights.empty() && blend.weights[k] > 0) {
        const bool by_split = flag == "--data-path";
        problems->push_back(flag + ": " + m.dataset->prefix() +
                            " has a positive weight but no training window of --seq-length + 1 tokens" +
                            (by_split ? " in its --split share" : "") +
                            " -- give it weight 0, use more data, a shorter --seq-length" +
                            (by_split ? " or a larger training share in --split" : ""));
      }
      continue;
    }
    out.members.push_back(first + k);
    weights.push_back(blend.weights.empty() ? static_cast<double>(windows) : blend.weights[k]);
    out.windows += windows;
  }
  // Explicit weights are normalised by Megatron's builder first, then again by BlendedDataset
  // (BlendIndex); sizes only by BlendedDataset.
  if (!weights.empty() && numpy_sum(weights) > 0)
    out.index = std::make_unique<BlendIndex>(blend.weights.empty() ? weights : megatron_normalize(weights));
  else
    out.windows = 0;
  return out;
}

}  // namespace

Result<std::shared_ptr<DataSource>> open_blended_data(const DataPaths& paths, const std::string& split,
                                                      int64_t seq_length, uint64_t seed, bool no_shuffle,
                                                      int64_t vocab_size) {
  const bool per_split = !blend_given(paths.data_path);
  const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  const std::vector<std::string>* lists[3] = {&paths.train_data_path, &paths.valid_data_path, &paths.test_data_path};
  std::vector<std::string> problems;
  std::array<DataBlend, 3> blends;
  if (!per_split) {
    auto blend = parse_data_blend(paths.data_path, "--data-path");
    if (!blend) return blend.status();
    if (blend->prefixes.size() == 1 && blend->weights.empty())
      return open_indexed_data(blend->prefixes[0], split, seq_length, seed, no_shuffle, vocab_size);
    blends[0] = std::move(blend).value();
  } else {
    for (int s = 0; s < 3; ++s) {
      auto blend = parse_data_blend(*lists[s], flags[s]);
      if (!blend) problems.push_back(blend.status().message());
      else blends[s] = std::move(blend).value();
    }
    if (problems.empty() && blends[0].prefixes.empty())
      problems.push_back(std::string(flags[0]) + " is required with --valid-data-path or --test-data-path -- give the "
                         "training datasets, or use --data-path with --split");
  }
  if (!problems.empty()) return Status::bad_input(problems[0]);  // parse errors hold every problem of their flag

  // Members: --data-path's datasets split by --split, or each per-split dataset whole in its split.
  std::vector<BlendMember> members;
  std::array<size_t, 3> first{0, 0, 0};
  for (int s = 0; s < (per_split ? 3 : 1); ++s) {
    first[s] = members.size();
    auto datasets = open_members(blends[s], vocab_size, &problems);
    for (auto& ds : datasets) {
      BlendMember m;
      m.dataset = ds;
      if (ds) {
        if (!per_split) {
          auto ranges = split_token_ranges(*ds, split);
          if (!ranges) return ranges.status();
          for (int k = 0; k < 3; ++k)
            m.windows[k] = std::make_unique<GptWindows>(ds, (*ranges)[k].first, (*ranges)[k].second, seq_length,
                                                        seed, k == 0 && !no_shuffle);
        } else {
          m.windows[s] =
              std::make_unique<GptWindows>(ds, 0, ds->total_tokens(), seq_length, seed, s == 0 && !no_shuffle);
        }
      }
      members.push_back(std::move(m));
    }
  }
  if (problems.empty()) {
    std::array<BlendedDataSource::Split, 3> splits;
    for (int s = 0; s < 3; ++s) {
      const int from = per_split ? s : 0;
      splits[s] = make_split(members, first[from], blends[from], s, per_split ? flags[s] : "--data-path", &problems);
    }
    if (problems.empty() && splits[0].windows == 0)
      problems.push_back(std::string(per_split ? flags[0] : "--data-path") +
                         ": no dataset has a training window of --seq-length + 1 tokens -- use more data or a "
                         "shorter --seq-length");
    if (problems.empty())
      return std::shared_ptr<DataSource>(std::make_shared<BlendedDataSource>(
          std::move(members), std::move(splits), seq_length, vocab_size,
          per_split ? "per-split datasets" : "blend"));
  }
  std::string message;
  for (size_t i = 0; i < problems.size(); ++i) message += (i ? "\n  " : "") + problems[i];
  return Status::bad_input(message);
}

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
