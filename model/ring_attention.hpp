// Ring attention: causal self-attention over a sequence split between the cp ranks of a
// context-parallel group (issue 29; docs/PARALLEL.md, "Long sequences"). Rank r holds the rows at
// global positions positions[r] (Megatron's load balancing: chunks r and 2cp-1-r of 2cp) of every
// sequence of the micro-batch; its queries meet every rank's keys and values as those travel the
// ring r -> r+1, each block sent on while the current one is computed, with the online softmax of
// ops::attention_block_* (kernels/ops.hpp). In the backward the key/value blocks travel again, each
// with the dK, dV its visitors added so far, and a last hop returns every block's gradient to its
// owner. Every rank computes its rows exactly as attention over the whole sequence would, up to
// rounding: positions, causality, ALiBi and attention dropout are global.
//
// Collectives: point-to-point messages on `cp` only (tags kRingTag + step), issued in the same order
// on every rank (all_gather: one all-gather, and in the backward one reduce-scatter); a failed peer
// surfaces as comm::CollectiveFailed from the wait. Every transfer is a span on the rank's timeline
// (comm::report_collective_span, category collective: "cp ring K/V 1/2, h.3", and the part of it
// the block's computation did not hide, "... (exposed)").
//
// Overlap. Forward: step s posts the receive of the next block and the send of the one in hand, then
// computes on it. Backward: step s posts the next block's transfer likewise, computes the block's
// dQ and this rank's share of its dK, dV, then adds the share the block's earlier visitors sent
// (in flight during the computation) and sends the sum on; after the last step the sum goes home.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/ops.hpp"

namespace troupe {

// How the key/value blocks reach every rank (Megatron's --cp-comm-type): p2p, the ring above, each
// block in flight while the one before it is computed; all_gather, one all-gather of every rank's
// block before any is computed, and in the backward one reduce-scatter of the blocks' dK, dV (more
// memory, no overlap, two collectives per layer instead of 2 (cp - 1) messages each way).
// a2a is not a ring: the context-parallel group's all-to-all from rows to heads and back around
// attention over whole sequences (model/gpt_chunk_ulysses.cpp; DeepSpeed-Ulysses, Transformer
// Engine's a2a); ring_attention_* do not take it.
enum class CpComm : uint8_t { p2p, all_gather, a2a };

// Buffers the ring reuses from call to call (each grows to the largest size asked for and stays): a
// rank's blocks, accumulators and gradients are then allocated once, not per step and layer, which the
// allocator would otherwise keep around as freed blocks. Owned by the caller (a chunk); one per thread.
class RingWorkspace {
 public:
  enum Slot : int { acc, m, l, kv0, kv1, delta, dq, dkv0, dkv1, dprev, all, dall, dmine, kSlots };
  // Slot `s` as a tensor of `shape` and `dtype` (contents undefined).
  Tensor get(Slot s, const Shape& shape, DType dtype);

 private:
  Tensor buf_[kSlots];
};

struct RingAttentionSpec {
  ops::AttentionLayout layout;                   // this rank's heads and groups (head_dim set)
  CpComm comm = CpComm::p2p;  // p2p or all_gather
  int64_t seq_len = 0;                           // the whole sequence
  std::vector<std::vector<int64_t>> positions;   // per cp rank: its rows' global positions
  DropoutMask mask;                              // attention dropout (inactive: none)
  int64_t head0 = 0;                             // global index of the first held head
  int layer = -1;                                // the global layer, for the timeline's span names
  RingWorkspace* workspace = nullptr;            // reused buffers; null: every call allocates its own
};

// The positions rank r of cp holds in a sequence of seq_len rows: chunks r and 2cp-1-r of 2cp, chunk
// k being rows [k seq_len / 2cp, (k+1) seq_len / 2cp).
std::vector<int64_t> context_parallel_positions(int64_t seq_len, int cp, int r);

// out (B,Tl,H*hs) and lse (B,H,Tl) (each row's log-sum-exp, for the backward) of this rank's rows;
// qkv (B,Tl,(H+2G)*hs) its rows' fused projections. All f32 or all f64.
void ring_attention_forward(Context& ctx, comm::Communicator& cp, const RingAttentionSpec& spec, const Tensor& qkv,
                            const Tensor& out, const Tensor& lse);
// dqkv (B,Tl,(H+2G)*hs) = the gradient of this rank's rows of qkv (overwritten), from dout and the
// forward's out and lse.
void ring_attention_backward(Context& ctx, comm::Communicator& cp, const RingAttentionSpec& spec, const Tensor& qkv,
                             const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dqkv);

}  // namespace troupe
