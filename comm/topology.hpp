// Topology: the one value that says how a job's ranks are laid out over the parallel dimensions
//   tp  tensor parallel    a layer's weights split over ranks; collectives inside every layer
//   cp  context parallel   the sequence split over ranks
//   ep  expert parallel    the experts of an MoE layer split over ranks
//   dp  data parallel      replicas / ZeRO partitions; grad reduce-scatter, param all-gather
//   pp  pipeline parallel  layers split into stages; activations sent stage to stage
// It maps a global rank to its coordinates and back and lists the groups every rank belongs to.
// It is built once from the job's sizes and passed explicitly (never global).
//
// Rank formula. The order string names the dimensions fastest first, separated by '-' (Megatron's
// default "tp-cp-ep-dp-pp": tp neighbours are adjacent ranks, pp stages are farthest apart).
// With the dimensions d_0, d_1, ... in that order:
//     rank = sum_i coord[d_i] * prod_{j<i} size[d_j]    (stride of d_i: prod_{j<i} size[d_j])
// Dimensions of size 1 may be left out of the order string (they contribute nothing). A group
// fixes every coordinate but its own dimension(s); members are listed by ascending global rank,
// which is ascending order of the varying coordinate, so group rank == that coordinate.
//
// Worked example 1: tp=2 pp=2 dp=2, world 8, default order (strides tp 1, dp 2, pp 4).
//     rank = tp + 2*dp + 4*pp.   rank 5 = 1 + 2*0 + 4*1  ->  tp 1, dp 0, pp 1.
//     rank 5's groups: tp {4,5}, dp {5,7}, pp {1,5}, embedding {1,5} (pp 1 is the last stage).
//     All tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
//     pp groups {0,4} {1,5} {2,6} {3,7}; model-parallel (tp x pp) groups {0,1,4,5} {2,3,6,7}.
// Worked example 2: tp=2 dp=3, world 6 (pp=1): rank = tp + 2*dp.  rank 3 -> tp 1, dp 1.
//     tp groups {0,1} {2,3} {4,5}; dp groups {0,2,4} {1,3,5}; rank 3's pp group and embedding
//     group are both {3}.
// Worked example 3: tp=1 pp=4 dp=2, world 8: rank = dp + 2*pp.  rank 2 -> dp 0, pp 1.
//     pp groups {0,2,4,6} {1,3,5,7}; embedding groups {0,6} {1,7}; rank 2 (a middle stage) has
//     none.
// Worked example 4: tp=2 pp=2 dp=2 with order "tp-pp-dp": rank = tp + 2*pp + 4*dp.
//     rank 5 -> tp 1, pp 0, dp 1; its dp group {1,5}, pp group {5,7}.
// Worked example 5: tp=2 cp=2 dp=2, world 8, default order: rank = tp + 2*cp + 4*dp.
//     rank 6 -> tp 0, cp 1, dp 1; its cp group {4,6}, dp group {2,6}, tp group {6,7}.
//
// Groups:
//   tp cp ep dp pp  vary that one coordinate.
//   mp              model parallel: vary tp and pp (Megatron's model-parallel group, used for
//                   gradient-norm reductions).
//   dp_cp           vary dp and cp (Megatron's data-parallel group with context parallelism): the
//                   ranks holding the same parameters, over which gradients are reduced and ZeRO
//                   partitions; the dp group itself when cp == 1.
//   embedding       the first and last rank of the rank's pp group (tied input/output embedding
//                   gradients are all-reduced between them); one rank when pp == 1. As in
//                   Megatron, a rank gets the group only if it is a member: ranks on middle stages
//                   get an empty list, and all_groups(embedding) lists one group per pp group.
//
// ep is one more orthogonal dimension here (world = tp*cp*ep*dp*pp). Megatron instead folds expert
// parallelism into dp for the expert layers; a second Topology with the expert layout can express
// that.
//
// Errors: create() refuses a zero or negative size, a world size that is not the product of the
// sizes, and an order string with an unknown or repeated name, an empty field, or a missing
// dimension whose size is > 1; the message names the offending value. Out-of-range ranks or
// coordinates passed to the accessors are bugs (TROUPE_CHECK).
// Thread safety: an immutable value; any thread may use a const Topology.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/status.hpp"

namespace troupe::comm {

enum class Dim : uint8_t { tp, cp, ep, dp, pp };
inline constexpr int kNumDims = 5;
const char* dim_name(Dim dim);  // "tp", "cp", ...

struct ParallelSizes {
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1;
  int of(Dim dim) const;
};

struct Coords {
  int tp = 0, pp = 0, dp = 0, cp = 0, ep = 0;
  int of(Dim dim) const;
  int& of(Dim dim);
  bool operator==(const Coords&) const = default;
};

enum class GroupKind : uint8_t { tp, cp, ep, dp, pp, mp, embedding, dp_cp };
const char* group_kind_name(GroupKind kind);  // "tp", ..., "mp", "embedding"

class Topology {
 public:
  static constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";

  static Result<Topology> create(ParallelSizes sizes, int world_size,
                                 std::string_view order = kDefaultOrder);

  int world_size() const { return world_size_; }
  const ParallelSizes& sizes() const { return sizes_; }
  const std::string& order() const { return order_; }  // as given to create()
  int stride(Dim dim) const { return stride_[static_cast<int>(dim)]; }

  Coords coords(int rank) const;    // rank in [0, world_size)
  int rank(const Coords& c) const;  // every coordinate in [0, size)

  // The members (ascending global ranks) of `rank`'s group of a kind; see the header comment.
  std::vector<int> group(GroupKind kind, int rank) const;
  std::vector<int> tp_group(int rank) const { return group(GroupKind::tp, rank); }
  std::vector<int> cp_group(int rank) const { return group(GroupKind::cp, rank); }
  std::vector<int> ep_group(int rank) const { return group(GroupKind::ep, rank); }
  std::vector<int> dp_group(int rank) const { return group(GroupKind::dp, rank); }
  std::vector<int> pp_group(int rank) const { return group(GroupKind::pp, rank); }
  std::vector<int> mp_group(int rank) const { return group(GroupKind::mp, rank); }
  std::vector<int> dp_cp_group(int rank) const { return group(GroupKind::dp_cp, rank); }
  std::vector<int> embedding_group(int rank) const { return group(GroupKind::embedding, rank); }
  // Expert parallelism as DeepSpeed (deepspeed/utils/groups.py) and Megatron-Core (ep after tp in
  // the order) form it, carved out of dp: the rank's dp group, listed by dp coordinate d, splits
  // into expert-parallel groups of ep consecutive coordinates (d's group: [ep*(d/ep), ep*(d/ep) + ep),
  // its rank there d % ep: which slice of the experts it holds) and expert-data-parallel groups of
  // every ep-th coordinate (d's: those congruent to d mod ep, its rank there d / ep: the replicas of
  // the same experts). ep must divide the dp size. Example: tp 2, dp 4, ep 2, world 8, rank =
  // tp + 2 dp: rank 3 (tp 1, dp 1): dp group {1,3,5,7}, expert-parallel {1,3}, expert-data-parallel
  // {3,7}. With context parallelism the expert-data-parallel group spans the cp ranks too (every cp
  // rank's tokens reach the same experts, whose gradients add over them; Megatron-Core's expert data
  // parallelism over dp x cp), in dp_cp_group's order; the expert-parallel group keeps one cp rank.
  std::vector<int> expert_parallel_group(int rank, int ep) const;
  std::vector<int> expert_data_parallel_group(int rank, int ep) const;

  bool is_first_stage(int rank) const { return coords(rank).pp == 0; }
  bool is_last_stage(int rank) const { return coords(rank).pp == sizes_.pp - 1; }

  // Every group of a kind, ordered by their lowest member. For every kind but embedding the groups
  // partition the world.
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

  // One line, e.g. "tp=2 cp=1 ep=1 dp=2 pp=2 (world 8, order tp-cp-ep-dp-pp)".
  std::string describe() const;

 private:
  Topology() = default;
  // Members of rank's group varying the dimensions in `mask` (bit i = Dim i), ascending.
  std::vector<int> vary(int rank, unsigned mask) const;

  ParallelSizes sizes_;
  int world_size_ = 1;
  std::string order_;
  std::array<int, kNumDims> stride_{};  // indexed by Dim
};

}  // namespace troupe::comm
