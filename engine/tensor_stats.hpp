// What troupe inspect's `tensor` shows of a parameter, its gradient or its Adam moments: the pieces
// every rank holds (RankEngine::tensor_pieces) put together in global coordinates, and statistics
// of the result. Also how those pieces travel between the inspectors of a job's processes (JSON,
// values as base64 of little-endian f32), parsed as hostile input: every size is checked against
// the document before anything is allocated.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/types.hpp"
#include "troupe/status.hpp"

namespace troupe {

struct TensorStats {
  int64_t count = 0;            // elements
  int64_t nan = 0, inf = 0;     // non-finite elements
  // Over the finite elements (0 when there is none), in double precision, in element order:
  double min = 0, max = 0, mean = 0, std = 0;  // std: population (ddof 0)
  double norm = 0;                             // sqrt of the sum of squares
  // bins equal-width buckets over [min, max] of the finite elements (the last includes max).
  std::vector<int64_t> histogram;
};
TensorStats tensor_stats(const float* values, int64_t n, int bins);

struct AssembledTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;  // row-major, shape's elements
  int64_t covered = 0;        // elements some piece holds
  std::vector<int> ranks;     // that held pieces, ascending
};
// The pieces of `parts` (every rank's, or only rank `only_rank`'s) in global coordinates. Fails when
// there is none, when they disagree on the name or shape, or overlap; elements nobody holds stay 0
// (covered says how many are held: all of them unless one rank's pieces were asked for).
Result<AssembledTensor> assemble_pieces(const std::vector<RankPieces>& parts, std::optional<int> only_rank = {});

std::string base64_encode(const void* data, size_t bytes);
// Fails on a character outside the alphabet, bad padding or a length that is not a multiple of 4.
Result<std::string> base64_decode(const std::string& text);

// {"pieces": [{"rank", "name", "shape": [...], "runs": [[start, length]...], "values": base64}]}
std::string pieces_to_json(const std::vector<RankPieces>& parts);
// At most kMaxPieceElements elements in all; runs inside the shape and as long as the values.
inline constexpr int64_t kMaxPieceElements = int64_t{1} << 30;
Result<std::vector<RankPieces>> pieces_from_json(const std::string& text);

}  // namespace troupe
