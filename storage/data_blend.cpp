#include "storage/data_blend.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <filesystem>

#include "troupe/check.hpp"

namespace troupe {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's float() on a weight, for the strings scripts write: optional sign, decimal digits with
// an optional fraction and exponent ("0.3", "+1", "1e-2", ".5"), or inf/nan (which parse, and are
// then refused as weights). Anything else is not a number (a prefix).
bool parse_number(const std::string& s, double* out) {
  std::string_view v(s);
  if (v.empty()) return false;
  if (v.front() == '+') {
    v.remove_prefix(1);
    if (v.empty() || v.front() == '+' || v.front() == '-') return false;
  }
  const char* first = v.data();
  const char* last = v.data() + v.size();
  auto [end, ec] = std::from_chars(first, last, *out, std::chars_format::general);
  if (end != last) return false;
  if (ec == std::errc::result_out_of_range) {
    *out = std::strtod(std::string(v).c_str(), nullptr);  // 1e999: inf, 1e-999: 0, as Python
    return true;
  }
  return ec == std::errc();
}

bool names_dataset(const std::string& item) {
  std::error_code ec;
  return std::filesystem::is_regular_file(item + ".idx", ec);
}

// numpy's pairwise_sum for float64 (numpy/core/src/umath/loops_utils.h.src): below 8 items a plain
// loop, up to 128 eight accumulators combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) then the
// rest, above that the two halves (split at a multiple of 8) summed recursively.
double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

}  // namespace

bool blend_given(const std::vector<std::string>& items) {
  for (const std::string& item : items)
    for (char c : item)
      if (!is_space(c)) return true;
  return false;
}

double numpy_sum(const std::vector<double>& values) { return pairwise_sum(values.data(), values.size()); }

std::vector<double> megatron_normalize(const std::vector<double>& weights) {
  const double sum = numpy_sum(weights);
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / sum;
  return out;
}

Result<DataBlend> parse_data_blend(const std::vector<std::string>& raw, const std::string& flag) {
  std::vector<std::string> items;
  for (const std::string& item : raw) {
    if (names_dataset(item)) {
      items.push_back(item);
      continue;
    }
    size_t i = 0;
    while (i < item.size()) {
      while (i < item.size() && is_space(item[i])) ++i;
      size_t j = i;
      while (j < item.size() && !is_space(item[j])) ++j;
      if (j > i) items.push_back(item.substr(i, j - i));
      i = j;
    }
  }
  DataBlend blend;
  if (items.empty()) return blend;
  std::vector<std::string> problems;
  const std::string example = "e.g. " + flag + " 0.3 a_text_document 0.7 b_text_document";
  const size_t max_items = 2 * kMaxBlendDatasets;
  if (items.size() > max_items) {
    problems.push_back(std::to_string(items.size()) + " items: a blend holds at most " +
                       std::to_string(kMaxBlendDatasets) + " datasets (Megatron's limit) -- merge datasets first");
    items.resize(max_items);
  }
  std::vector<double> number(items.size());
  std::vector<bool> numeric(items.size());
  for (size_t i = 0; i < items.size(); ++i) numeric[i] = parse_number(items[i], &number[i]);

  if (items.size() % 2 == 1) {
    // Megatron reads an odd list as prefixes only; a number among them is a weight without its prefix.
    std::vector<std::string> numbers;
    for (size_t i = 0; i < items.size(); ++i)
      if (numeric[i]) numbers.push_back("'" + items[i] + "' (item " + std::to_string(i + 1) + ")");
    if (!numbers.empty()) {
      std::string list;
      for (const auto& n : numbers) list += (list.empty() ? "" : ", ") + n;
      problems.push_back("has an odd number of items (" + std::to_string(items.size()) + ") and " + list +
                         (numbers.size() == 1 ? " is a number" : " are numbers") +
                         ": a weight without its prefix, or a prefix without its weight -- give WEIGHT PREFIX "
                         "pairs, " + example + ", or prefixes only");
    }
    blend.prefixes = items;
  } else {
    size_t weights_found = 0;
    for (size_t i = 0; i < items.size(); i += 2) weights_found += numeric[i];
    if (weights_found == 0) {
      blend.prefixes = items;  // prefixes only, weighed by size
    } else {
      for (size_t i = 0; i < items.size(); i += 2) {
        const std::string where = "item " + std::to_string(i + 1) + " '" + items[i] + "'";
        if (!numeric[i]) {
          problems.push_back(where + " is not a number, but other pairs start with a weight -- give a weight before "
                             "every prefix, " + example);
        } else if (!std::isfinite(number[i])) {
          problems.push_back("the weight " + where + " is not finite -- use a non-negative number");
        } else if (number[i] < 0) {
          problems.push_back("the weight " + where + " is negative -- use a non-negative number");
        }
        if (numeric[i + 1])
          problems.push_back("item " + std::to_string(i + 2) + " '" + items[i + 1] +
                             "' is a number where a dataset prefix belongs -- give WEIGHT PREFIX pairs, " + example);
        blend.prefixes.push_back(items[i + 1]);
        blend.weights.push_back(numeric[i] ? number[i] : 0.0);
      }
      if (problems.empty() && !(numpy_sum(blend.weights) > 0))
        problems.push_back("has weights that are all 0 -- give at least one dataset a positive weight");
    }
  }
  if (!problems.empty()) {
    std::string message = flag + ": ";
    for (size_t i = 0; i < problems.size(); ++i) message += (i ? "\n  " + flag + ": " : "") + problems[i];
    return Status::bad_input(message);
  }
  return blend;
}

BlendIndex::BlendIndex(std::vector<double> weights) {
  TROUPE_CHECK(!weights.empty() && weights.size() <= kMaxBlendDatasets, "a blend needs 1 to 32766 datasets");
  for (double w : weights) TROUPE_CHECK(std::isfinite(w) && w >= 0, "blend weights must be finite and >= 0");
  TROUPE_CHECK(numpy_sum(weights) > 0, "blend weights must not all be 0");
  weights_ = megatron_normalize(weights);
  snapshots_.push_back(std::vector<int64_t>(weights_.size(), 0));
}

void BlendIndex::decode_block(int64_t block) const {
  // Extend the snapshots up to `block`, then decode it.
  cached_dataset_.resize(kBlock);
  cached_dataset_sample_.resize(kBlock);
  const size_t n = weights_.size();
  for (int64_t b = std::min(block, static_cast<int64_t>(snapshots_.size()) - 1); b <= block; ++b) {
    std::vector<int64_t> taken = snapshots_[static_cast<size_t>(b)];
    for (int64_t k = 0; k < kBlock; ++k) {
      const int64_t sample = b * kBlock + k;
      // helpers.cpp build_blending_indices: error = w * max(i, 1) - taken; the first maximum wins.
      const double i_double = std::max(static_cast<double>(sample), 1.0);
      size_t best = 0;
      double best_error = weights_[0] * i_double - static_cast<double>(taken[0]);
      for (size_t d = 1; d < n; ++d) {
        const double error = weights_[d] * i_double - static_cast<double>(taken[d]);
        if (error > best_error) {
          best_error = error;
          best = d;
        }
      }
      if (b == block) {
        cached_dataset_[static_cast<size_t>(k)] = static_cast<int32_t>(best);
        cached_dataset_sample_[static_cast<size_t>(k)] = taken[best];
      }
      ++taken[best];
    }
    if (static_cast<size_t>(b + 1) == snapshots_.size()) snapshots_.push_back(std::move(taken));
  }
  cached_block_ = block;
}

std::pair<int32_t, int64_t> BlendIndex::at(int64_t sample) const {
  TROUPE_CHECK(sample >= 0, "blend sample index must be non-negative");
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t block = sample / kBlock;
  if (block != cached_block_) decode_block(block);
  const auto k = static_cast<size_t>(sample % kBlock);
  return {cached_dataset_[k], cached_dataset_sample_[k]};
}

}  // namespace troupe
