// "Did you mean ...?" for names a user typed: flags, JSON keys. The distance is the optimal string
// alignment distance (insertions, deletions, substitutions and transpositions of neighbours, each
// 1), with '-' and '_' counted as the same character, since Megatron and torchrun accept both.
// Pure functions, thread-safe.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// Names longer than this are never compared (the distance table is quadratic in the lengths):
// spelling_distance returns kSpellingUnrelated for them.
constexpr size_t kSpellingMaxLength = 256;
constexpr size_t kSpellingUnrelated = static_cast<size_t>(-1);

// With `bound`, any distance above it may be returned as bound + 1 (the computation stops once every
// alignment costs more).
size_t spelling_distance(std::string_view a, std::string_view b, size_t bound = kSpellingUnrelated - 1);

// The nearest of `candidates` to `word` (at most `most`, nearest first, ties in the candidates'
// order), within max(min_edits, (|word| - prefix) / 4) edits, where prefix is the length of a
// leading "--"; empty when none is that near.
std::vector<std::string> nearest_spellings(std::string_view word, const std::vector<std::string>& candidates,
                                           size_t most = 2, size_t min_edits = 2);

}  // namespace troupe
