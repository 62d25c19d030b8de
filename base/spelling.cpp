#include "base/spelling.hpp"

#include <algorithm>
#include <utility>

namespace troupe {
namespace {

char fold(char c) { return c == '_' ? '-' : c; }

}  // namespace

size_t spelling_distance(std::string_view a, std::string_view b, size_t bound) {
  if (a.size() > kSpellingMaxLength || b.size() > kSpellingMaxLength) return kSpellingUnrelated;
  const size_t n = a.size(), m = b.size();
  // Three rows suffice: a transposition looks two rows back.
  std::vector<size_t> back2(m + 1), back1(m + 1), row(m + 1);
  for (size_t j = 0; j <= m; ++j) back1[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    row[0] = i;
    size_t least = row[0];
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = fold(a[i - 1]) == fold(b[j - 1]) ? 0 : 1;
      row[j] = std::min({back1[j] + 1, row[j - 1] + 1, back1[j - 1] + cost});
      if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]))
        row[j] = std::min(row[j], back2[j - 2] + 1);
      least = std::min(least, row[j]);
    }
    // The rows' least values never fall: a cell costs at least the least of the row above (a
    // transposition's cell two rows up is at most one below it, and adds 1), so the distance does not
    // come back under the bound.
    if (least > bound) return bound + 1;
    std::swap(back2, back1);
    std::swap(back1, row);
  }
  return back1[m];
}

std::vector<std::string> nearest_spellings(std::string_view word, const std::vector<std::string>& candidates,
                                           size_t most, size_t min_edits) {
  const size_t prefix = word.rfind("--", 0) == 0 ? 2 : 0;
  const size_t limit = std::max<size_t>(min_edits, (word.size() - prefix) / 4);
  std::vector<std::pair<size_t, size_t>> scored;  // (distance, index in candidates)
  for (size_t k = 0; k < candidates.size(); ++k) {
    // The distance is at least the difference of the lengths: a candidate farther than that is
    // left without filling its table.
    const size_t m = candidates[k].size();
    if ((m > word.size() ? m - word.size() : word.size() - m) > limit) continue;
    const size_t d = spelling_distance(word, candidates[k], limit);
    if (d <= limit) scored.emplace_back(d, k);
  }
  std::stable_sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (const auto& [d, k] : scored) {
    if (out.size() >= most) break;
    if (std::find(out.begin(), out.end(), candidates[k]) == out.end()) out.push_back(candidates[k]);
  }
  return out;
}

}  // namespace troupe
