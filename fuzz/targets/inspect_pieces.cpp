// What another process's inspector answers to "tensor-part SEQ" (pieces_from_json,
// engine/tensor_stats.hpp): read by rank 0's inspector for `tensor` and `dump`. Property: accepted
// pieces written back by pieces_to_json read back to the same pieces; assembling them and their
// statistics never crash.
#include <cstring>

#include "engine/tensor_stats.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "troupe/check.hpp"

namespace troupe::fuzz {

Status inspect_pieces(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parts = pieces_from_json(text);
  if (!parts) return parts.status();
  auto again = pieces_from_json(pieces_to_json(parts.value()));
  TROUPE_CHECK(again.is_ok() && again->size() == parts->size(), "accepted pieces do not read back");
  for (size_t i = 0; i < parts->size(); ++i) {
    const RankPieces &a = (*parts)[i], &b = (*again)[i];
    TROUPE_CHECK(a.rank == b.rank && a.pieces.size() == b.pieces.size(), "a rank's pieces do not read back");
    for (size_t k = 0; k < a.pieces.size(); ++k) {
      const TensorPiece &x = a.pieces[k], &y = b.pieces[k];
      TROUPE_CHECK(x.name == y.name && x.global_shape == y.global_shape && x.runs == y.runs &&
                       x.values.numel() == y.values.numel() &&
                       std::memcmp(x.values.data<float>(), y.values.data<float>(), x.values.numel() * 4) == 0,
                   "a piece does not read back to itself");
    }
  }
  // Assembly allocates the global shape: only for what a job could hold.
  int64_t largest = 0;
  for (const RankPieces& p : parts.value())
    for (const TensorPiece& t : p.pieces) largest = std::max(largest, t.global_shape.numel());
  if (largest <= (int64_t{1} << 22))
    if (auto whole = assemble_pieces(parts.value()); whole.is_ok())
      (void)tensor_stats(whole->values.data(), static_cast<int64_t>(whole->values.size()), 16);
  return Status::ok();
}

}  // namespace troupe::fuzz
