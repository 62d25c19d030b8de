// model/ring_attention.hpp.
#include "model/ring_attention.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "troupe/check.hpp"

namespace troupe {

namespace {

constexpr uint64_t kRingTag = 0x52494e47000000ull;  // "RING": forward steps, then backward, then the return

// Columns [c0, c0 + w) of every row of a (B, T, W) tensor into out (B, T, w).
Tensor columns(const Tensor& t, int64_t c0, int64_t w, Tensor out) {
  const int64_t B = t.dim(0), T = t.dim(1), W = t.dim(2), esz = static_cast<int64_t>(dtype_size(t.dtype()));
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t row = 0; row < B * T; ++row) std::memcpy(dst + row * w * esz, src + (row * W + c0) * esz, w * esz);
  return out;
}

struct Sizes {
  int64_t B, Tl, H, G, hs, C, W, KV;
};

Sizes sizes_of(const RingAttentionSpec& spec, const Tensor& qkv, int cp_size, int rank) {
  const ops::AttentionLayout& l = spec.layout;
  const int64_t H = l.n_head, G = l.n_group > 0 ? l.n_group : H, hs = l.head_dim;
  TROUPE_CHECK(H > 0 && G > 0 && H % G == 0 && hs > 0, "ring attention: the layout needs heads, groups and head_dim");
  TROUPE_CHECK(static_cast<int>(spec.positions.size()) == cp_size, "ring attention: one position list per cp rank");
  TROUPE_CHECK(qkv.rank() == 3 && qkv.dim(1) == static_cast<int64_t>(spec.positions[rank].size()) &&
                   qkv.dim(2) == (H + 2 * G) * hs,
               "ring attention: qkv is (B, this rank's rows, (H+2G)*hs)");
  return {qkv.dim(0), qkv.dim(1), H, G, hs, H * hs, (H + 2 * G) * hs, 2 * G * hs};
}

ops::AttentionBlock block_of(const RingAttentionSpec& spec, int rank) {
  ops::AttentionBlock b;
  b.layout = spec.layout;
  if (b.layout.n_group == 0) b.layout.n_group = b.layout.n_head;
  b.seq_len = spec.seq_len;
  b.qpos = spec.positions[static_cast<size_t>(rank)];
  return b;
}

void wait(const comm::WorkPtr& w, const char* what) { comm::wait_or_throw(w, what, comm::WaitGroup::other); }

// A buffer of the spec's workspace, or a new tensor without one.
Tensor buffer(const RingAttentionSpec& spec, RingWorkspace::Slot s, const Shape& shape, DType dt) {
  return spec.workspace != nullptr ? spec.workspace->get(s, shape, dt) : Tensor::empty(shape, dt);
}
Tensor zeroed(const RingAttentionSpec& spec, RingWorkspace::Slot s, const Shape& shape, DType dt) {
  Tensor t = buffer(spec, s, shape, dt);
  t.zero_();
  return t;
}

using Clock = std::chrono::steady_clock;

std::string layer_suffix(const RingAttentionSpec& spec) {
  return spec.layer >= 0 ? ", h." + std::to_string(spec.layer) : std::string();
}

// Ring step s's transfer of `what` on the timeline (comm::report_collective_span: the rank's listener
// records it inside the pass that issued it): from its posting to its completion, and the part the
// step's computation did not hide, from the computation's end on ("exposed"; none when the transfer
// ended first).
void step_span(const RingAttentionSpec& spec, const char* what, int s, int P, Clock::time_point issued,
               Clock::time_point computed) {
  const std::string name = std::string("cp ring ") + what + " " + std::to_string(s + 1) + "/" + std::to_string(P) +
                           layer_suffix(spec);
  comm::report_collective_span(name, issued);
  if (Clock::now() > computed) comm::report_collective_span(name + " (exposed)", std::max(issued, computed));
}

// dqkv's rows = [dq | dkv].
void join_rows(const Tensor& dq, const Tensor& dkv, const Tensor& dqkv, const Sizes& z) {
  const int64_t esz = static_cast<int64_t>(dtype_size(dq.dtype()));
  const char* q = static_cast<const char*>(dq.raw());
  const char* kv = static_cast<const char*>(dkv.raw());
  char* d = static_cast<char*>(dqkv.raw());
  for (int64_t row = 0; row < z.B * z.Tl; ++row) {
    std::memcpy(d + row * z.W * esz, q + row * z.C * esz, z.C * esz);
    std::memcpy(d + (row * z.W + z.C) * esz, kv + row * z.KV * esz, z.KV * esz);
  }
}

}  // namespace

Tensor RingWorkspace::get(Slot s, const Shape& shape, DType dtype) {
  Tensor& b = buf_[s];
  const int64_t n = shape.numel();
  if (!b.defined() || b.dtype() != dtype || b.numel() < n) b = Tensor::empty({n}, dtype);
  return b.rows(0, n).view(shape);
}

std::vector<int64_t> context_parallel_positions(int64_t seq_len, int cp, int r) {
  TROUPE_CHECK(cp >= 1 && r >= 0 && r < cp && seq_len >= 2 * cp, "context_parallel_positions: 0 <= r < cp, seq_len >= 2 cp");
  std::vector<int64_t> pos;
  for (int k : {r, 2 * cp - 1 - r})
    for (int64_t i = k * seq_len / (2 * cp); i < (k + 1) * seq_len / (2 * cp); ++i) pos.push_back(i);
  return pos;
}

namespace {

void check_equal_blocks(const RingAttentionSpec& spec) {
  for (const auto& p : spec.positions)
    TROUPE_CHECK(p.size() == spec.positions.front().size(), "ring attention, all_gather: every rank holds as many rows");
}

// Every rank's key/value block, (P*B, Tl, KV) in rank order: one all-gather (its span on the timeline).
Tensor gather_blocks(comm::Communicator& cp, const RingAttentionSpec& spec, const Sizes& z, const Tensor& qkv) {
  const DType dt = qkv.dtype();
  const Tensor mine = columns(qkv, z.C, z.KV, buffer(spec, RingWorkspace::kv0, {z.B, z.Tl, z.KV}, dt));
  const Tensor all = buffer(spec, RingWorkspace::all, {cp.size() * z.B, z.Tl, z.KV}, dt);
  const Clock::time_point issued = Clock::now();
  wait(cp.all_gather(mine.raw(), all.raw(), static_cast<size_t>(mine.numel()), dt),
       "ring attention: gathering the key/value blocks");
  comm::report_collective_span("cp all-gather K/V" + layer_suffix(spec), issued);
  return all;
}

// cp_comm_type all_gather: every rank's key/value block at once, then the blocks in rank order.
void gathered_forward(Context& ctx, comm::Communicator& cp, const RingAttentionSpec& spec, const Sizes& z,
                      const Tensor& qkv, const Tensor& out, const Tensor& lse) {
  const int P = cp.size(), r = cp.rank();
  check_equal_blocks(spec);
  const DType dt = qkv.dtype();
  ops::AttentionBlock blk = block_of(spec, r);
  const Tensor acc = buffer(spec, RingWorkspace::acc, {z.B, z.Tl, z.C}, dt),
               m = buffer(spec, RingWorkspace::m, {z.B, z.H, z.Tl}, dt),
               l = buffer(spec, RingWorkspace::l, {z.B, z.H, z.Tl}, dt);
  ops::attention_block_begin(ctx, acc, m, l);
  const Tensor all = gather_blocks(cp, spec, z, qkv);
  for (int q = 0; q < P; ++q) {
    blk.kpos = spec.positions[static_cast<size_t>(q)];
    ops::attention_block_forward(ctx, acc, m, l, qkv, all.rows(q * z.B, (q + 1) * z.B), blk, spec.mask, spec.head0);
  }
  ops::attention_block_finish(ctx, out, lse, acc, m, l);
}

// Its backward: every block's dK, dV here, then one reduce-scatter returns each owner the sum.
Tensor gathered_backward(Context& ctx, comm::Communicator& cp, const RingAttentionSpec& spec, const Sizes& z,
                         const Tensor& qkv, const Tensor& lse, const Tensor& dout, const Tensor& delta,
                         const Tensor& dq) {
  const int P = cp.size(), r = cp.rank();
  check_equal_blocks(spec);
  const DType dt = qkv.dtype();
  ops::AttentionBlock blk = block_of(spec, r);
  const Tensor all = gather_blocks(cp, spec, z, qkv);
  const size_t n = static_cast<size_t>(z.B * z.Tl * z.KV);
  const Tensor dall = zeroed(spec, RingWorkspace::dall, {P * z.B, z.Tl, z.KV}, dt);
  for (int q = 0; q < P; ++q) {
    blk.kpos = spec.positions[static_cast<size_t>(q)];
    ops::attention_block_backward(ctx, dq, dall.rows(q * z.B, (q + 1) * z.B), dout, delta, lse, qkv,
                                  all.rows(q * z.B, (q + 1) * z.B), blk, spec.mask, spec.head0);
  }
  Tensor dmine = buffer(spec, RingWorkspace::dmine, {z.B, z.Tl, z.KV}, dt);
  const Clock::time_point scattered = Clock::now();
  wait(cp.reduce_scatter(dall.raw(), dmine.raw(), n, dt, comm::ReduceOp::sum),
       "ring attention: returning the key/value gradients");
  comm::report_collective_span("cp reduce-scatter dK/dV" + layer_suffix(spec), scattered);
  return dmine;
}

}  // namespace

void ring_attention_forward(Context& ctx, comm::Communicator& cp, const RingAttentionSpec& spec, const Tensor& qkv,
                            const Tensor& out, const Tensor& lse) {
  const int P = cp.size(), r = cp.rank();
  const Sizes z = sizes_of(spec, qkv, P, r);
  if (spec.comm == CpComm::all_gather) return gathered_forward(ctx, cp, spec, z, qkv, out, lse);
  const DType dt = qkv.dtype();
  ops::AttentionBlock blk = block_of(spec, r);
  const Tensor acc = buffer(spec, RingWorkspace::acc, {z.B, z.Tl, z.C}, dt),
               m = buffer(spec, RingWorkspace::m, {z.B, z.H, z.Tl}, dt),
               l = buffer(spec, RingWorkspace::l, {z.B, z.H, z.Tl}, dt);
  ops::attention_block_begin(ctx, acc, m, l);
  // (Two key/value buffers in turn: the block in hand and the next one.)
  Tensor cur = columns(qkv, z.C, z.KV, buffer(spec, RingWorkspace::kv0, {z.B, z.Tl, z.KV}, dt));  // the block in hand: this rank's, then its predecessors'
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  for (int s = 0; s < P; ++s) {
    const int owner = (r - s + P) % P;
    comm::WorkPtr sent, got;
    Tensor incoming;
    const Clock::time_point issued = Clock::now();
    if (s + 1 < P) {  // the next block in flight while this one is computed
      const int from = (owner - 1 + P) % P;
      incoming = buffer(spec, s % 2 == 0 ? RingWorkspace::kv1 : RingWorkspace::kv0,
                        {z.B, static_cast<int64_t>(spec.positions[from].size()), z.KV}, dt);
      got = cp.recv(incoming.raw(), static_cast<size_t>(incoming.numel()), dt, prev, kRingTag + s);
      sent = cp.send(cur.raw(), static_cast<size_t>(cur.numel()), dt, next, kRingTag + s);
    }
    blk.kpos = spec.positions[static_cast<size_t>(owner)];
    ops::attention_block_forward(ctx, acc, m, l, qkv, cur, blk, spec.mask, spec.head0);
    const Clock::time_point computed = Clock::now();
    if (s + 1 < P) {
      wait(got, "ring attention: receiving a key/value block");
      wait(sent, "ring attention: sending a key/value block");
      step_span(spec, "K/V", s, P, issued, computed);
      cur = std::move(incoming);
    }
  }
  ops::attention_block_finish(ctx, out, lse, acc, m, l);
}

void ring_attention_backward(Context& ctx, comm::Communicator& cp, const RingAttentionSpec& spec, const Tensor& qkv,
                             const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dqkv) {
  const int P = cp.size(), r = cp.rank();
  const Sizes z = sizes_of(spec, qkv, P, r);
  const DType dt = qkv.dtype();
  TROUPE_CHECK(dqkv.numel() == qkv.numel() && dqkv.dtype() == dt, "ring attention backward: dqkv is qkv's shape");
  ops::AttentionBlock blk = block_of(spec, r);
  const Tensor delta = buffer(spec, RingWorkspace::delta, {z.B, z.H, z.Tl}, dt),
               dq = zeroed(spec, RingWorkspace::dq, {z.B, z.Tl, z.C}, dt);
  ops::attention_block_delta(ctx, delta, dout, out);
  if (spec.comm == CpComm::all_gather) {
    const Tensor dkv = gathered_backward(ctx, cp, spec, z, qkv, lse, dout, delta, dq);
    return join_rows(dq, dkv, dqkv, z);
  }
  // Step s: the block of rank r - s is in hand; the next one is already on its way (posted before the
  // block's computation), and so is the dK, dV the block's earlier visitors added up (sent by the
  // previous rank after its step s - 1), added to this rank's share once that is computed; the sum
  // goes on to the next rank, and after the last step home to the block's owner.
  Tensor cur = columns(qkv, z.C, z.KV, buffer(spec, RingWorkspace::kv0, {z.B, z.Tl, z.KV}, dt)), dcur;
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  const uint64_t base = kRingTag + 2 * static_cast<uint64_t>(P);
  comm::WorkPtr got_d, sent_d;
  Tensor dprev;    // the earlier visitors' dK, dV of the block in hand (in flight until waited)
  Tensor sending;  // what sent_d reads until it is waited (without a workspace: kept alive here)
  Clock::time_point d_issued{};
  for (int s = 0; s < P; ++s) {
    const int owner = (r - s + P) % P, from = (owner - 1 + P) % P;
    comm::WorkPtr got_kv, sent_kv;
    Tensor knext;
    const Clock::time_point kv_issued = Clock::now();
    if (s + 1 < P) {
      knext = buffer(spec, s % 2 == 0 ? RingWorkspace::kv1 : RingWorkspace::kv0,
                     {z.B, static_cast<int64_t>(spec.positions[static_cast<size_t>(from)].size()), z.KV}, dt);
      got_kv = cp.recv(knext.raw(), static_cast<size_t>(knext.numel()), dt, prev, base + 2 * s + 1);
      sent_kv = cp.send(cur.raw(), static_cast<size_t>(cur.numel()), dt, next, base + 2 * s + 1);
    }
    blk.kpos = spec.positions[static_cast<size_t>(owner)];
    // This rank's share, in two buffers in turn: step s's is sent on and read until step s + 1 waits.
    dcur = zeroed(spec, s % 2 == 0 ? RingWorkspace::dkv0 : RingWorkspace::dkv1,
                  {z.B, static_cast<int64_t>(blk.kpos.size()), z.KV}, dt);
    ops::attention_block_backward(ctx, dq, dcur, dout, delta, lse, qkv, cur, blk, spec.mask, spec.head0);
    const Clock::time_point computed = Clock::now();
    if (P == 1) break;
    if (s > 0) {  // the earlier visitors' share of this block
      wait(got_d, "ring attention: receiving a key/value gradient");
      wait(sent_d, "ring attention: sending a key/value gradient");
      step_span(spec, "dK/dV", s - 1, P, d_issued, computed);
      ops::add_inplace(ctx, dcur, dprev);
    }
    // On to the next rank (after the last step: home), and the share of the next block from the
    // previous one (after the last step: this rank's own block, complete).
    const int64_t rows_in = static_cast<int64_t>(spec.positions[static_cast<size_t>(s + 1 < P ? from : r)].size());
    dprev = buffer(spec, RingWorkspace::dprev, {z.B, rows_in, z.KV}, dt);
    d_issued = Clock::now();
    got_d = cp.recv(dprev.raw(), static_cast<size_t>(dprev.numel()), dt, prev, base + 2 * s);
    sent_d = cp.send(dcur.raw(), static_cast<size_t>(dcur.numel()), dt, next, base + 2 * s);
    sending = dcur;
    if (s + 1 < P) {
      wait(got_kv, "ring attention: receiving a key/value block");
      wait(sent_kv, "ring attention: sending a key/value block");
      step_span(spec, "K/V", s, P, kv_issued, computed);
      cur = std::move(knext);
    } else {
      wait(got_d, "ring attention: receiving this rank's key/value gradient");
      wait(sent_d, "ring attention: sending a key/value gradient home");
      step_span(spec, "dK/dV", s, P, d_issued, d_issued);
      dcur = dprev;
    }
  }
  // dcur is now this rank's own block's whole dK, dV; dq its queries' gradient.
  join_rows(dq, dcur, dqkv, z);
}

}  // namespace troupe
