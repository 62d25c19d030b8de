// A data blend as --data-path, --train-data-path, --valid-data-path and --test-data-path give it
// (parse_data_blend, storage/data_blend.hpp): one item a line. Properties: an accepted blend has
// as many weights as prefixes or none, finite non-negative weights of positive sum; its items
// joined by spaces into one string (a quoted DATA_PATH) parse to the same blend; the blending
// indices of its weights take each dataset's samples in order, and keep each within two samples of
// its share.
#include <cmath>
#include <sstream>

#include "fuzz/fuzz_targets.hpp"
#include "storage/data_blend.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status data_blend(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<std::string> items;
  for (std::string line; std::getline(in, line);) items.push_back(line);
  auto blend = parse_data_blend(items, "--data-path");
  if (!blend) return blend.status();
  const DataBlend& b = blend.value();
  TROUPE_CHECK(b.weights.empty() || b.weights.size() == b.prefixes.size(), "weights and prefixes differ in count");
  TROUPE_CHECK(b.prefixes.size() <= kMaxBlendDatasets, "more datasets than the limit");
  std::string joined;
  for (const std::string& item : items) joined += item + " ";
  auto again = parse_data_blend({joined}, "--data-path");
  bool names_file = false;  // an item naming an existing dataset stays whole: no round trip then
  for (const std::string& p : b.prefixes) names_file |= p.find_first_of(" \t\r\f\v") != std::string::npos;
  if (!names_file)
    TROUPE_CHECK(again.is_ok() && again->prefixes == b.prefixes && again->weights == b.weights,
                 "a blend given as one string parses differently");
  if (b.weights.empty()) return Status::ok();
  double sum = 0;
  for (double w : b.weights) {
    TROUPE_CHECK(std::isfinite(w) && w >= 0, "an accepted weight is negative or not finite");
    sum += w;
  }
  TROUPE_CHECK(sum > 0, "accepted weights sum to 0");
  if (b.weights.size() > 64) return Status::ok();  // the indices' cost grows with the datasets
  BlendIndex index(megatron_normalize(b.weights));
  std::vector<int64_t> taken(b.weights.size(), 0);
  const int64_t samples = 5000;
  for (int64_t i = 0; i < samples; ++i) {
    const auto [d, s] = index.at(i);
    TROUPE_CHECK(d >= 0 && static_cast<size_t>(d) < taken.size() && s == taken[static_cast<size_t>(d)],
                 "a dataset's samples are not taken in order");
    ++taken[static_cast<size_t>(d)];
  }
  for (size_t d = 0; d < taken.size(); ++d)
    TROUPE_CHECK(std::abs(static_cast<double>(taken[d]) - index.weights()[d] * samples) <= 2.0 + 1e-6 * samples,
                 "a dataset's share strays from its weight");
  return Status::ok();
}

}  // namespace troupe::fuzz
