// All-to-all attention over the context-parallel group (DeepSpeed-Ulysses, --ds-sequence-parallel-size;
// Transformer Engine's --cp-comm-type a2a): before the attention core an all-to-all turns this
// rank's T rows of every one of its Hl heads (and Gl key/value groups) into all Tg rows of Hu = Hl /
// cp heads (Gu = Gl / cp groups), the core runs on whole sequences (attention_forward: causality,
// ALiBi and dropout by global position and global head, exactly as one rank would), and a second
// all-to-all returns the output to this rank's rows of every head. The backward runs the duals: the
// output gradient to whole sequences, attention_backward, dq, dk, dv back to this rank's rows.
//
// Column slices. A (T, W) tensor's columns are segments (q, k, v of qkv; the heads of att), each of
// cp equal slices; slice j of every segment goes to (or comes from) rank j. Rows: the rank holding
// rows at positions pos_i (ring.positions[i], Megatron's load-balanced chunks or, for Ulysses, one
// contiguous range) sends (receives) exactly those rows of the whole sequence.
#include <chrono>
#include <cstring>

#include "model/gpt_chunk_impl.hpp"

namespace troupe {

namespace {

// The column segments of a (rows, W) tensor, each split in cp slices.
struct Segments {
  std::vector<int64_t> offset, width;  // width: the whole segment's
  int64_t slice_width(int P) const {   // one slice of every segment
    int64_t w = 0;
    for (int64_t x : width) w += x / P;
    return w;
  }
};

// q, k, v of a fused qkv (A = Hl hs query columns, K = Gl hs each for k and v), or the attention output.
Segments segments_of(bool qkv_columns, int64_t A, int64_t K) {
  return qkv_columns ? Segments{{0, A, A + K}, {A, K, K}} : Segments{{0}, {A}};
}

// The first n elements of a staging buffer (allocated once for the widest exchange, q, k and v).
Tensor staging(const Tensor& buffer, int64_t n) {
  TROUPE_CHECK(n <= buffer.numel(), "Ulysses: an all-to-all wider than its staging buffer");
  return buffer.rows(0, n);
}

}  // namespace

// local (B, T, W) -> whole (B, Tg, W / cp): slice `cpr` of every segment of every rank's rows.
// `what`, `layer`: the span's name on the timeline.
void GptChunk::Impl::ulysses_to_heads(const Tensor& local, const Tensor& whole, bool qkv_columns, const char* what,
                                      int layer) {
  const Segments seg = segments_of(qkv_columns, Al, int64_t{Gl} * hs);
  const int P = cps;
  const int64_t esz = static_cast<int64_t>(dtype_size(dtype));
  const int64_t wu = seg.slice_width(P);  // the columns rank j gets: slice j of every segment
  const int64_t W = local.dim(2);
  // Send: block j = (B, T, wu), slice j of each segment.
  const Tensor send = staging(u_send, int64_t{P} * B * T * wu), recv = staging(u_recv, B * Tg * wu);
  const char* src = static_cast<const char*>(local.raw());
  char* out = static_cast<char*>(send.raw());
  for (int j = 0; j < P; ++j)
    for (int64_t row = 0; row < B * T; ++row) {
      char* dst = out + ((int64_t{j} * B * T + row) * wu) * esz;
      for (size_t s = 0; s < seg.offset.size(); ++s) {
        const int64_t w = seg.width[s] / P;
        std::memcpy(dst, src + (row * W + seg.offset[s] + j * w) * esz, static_cast<size_t>(w * esz));
        dst += w * esz;
      }
    }
  std::vector<size_t> sc(static_cast<size_t>(P)), rc(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    sc[static_cast<size_t>(q)] = static_cast<size_t>(B * T * wu);
    rc[static_cast<size_t>(q)] = static_cast<size_t>(B * static_cast<int64_t>(ring.positions[q].size()) * wu);
  }
  const auto issued = std::chrono::steady_clock::now();
  comm::wait_or_throw(cp->all_to_all_v(send.raw(), sc, recv.raw(), rc, dtype),
                      std::string("the context-parallel all-to-all of ") + what, comm::WaitGroup::other);
  comm::report_collective_span(std::string("cp all-to-all ") + what + ", h." + std::to_string(layer), issued);
  // Rank i's block: (B, its rows, wu), its rows at positions ring.positions[i] of the sequence.
  const char* in = static_cast<const char*>(recv.raw());
  char* dst = static_cast<char*>(whole.raw());
  for (int i = 0; i < P; ++i) {
    const std::vector<int64_t>& p = ring.positions[static_cast<size_t>(i)];
    const int64_t n = static_cast<int64_t>(p.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(dst + ((b * Tg + p[static_cast<size_t>(t)]) * wu) * esz, in + ((b * n + t) * wu) * esz,
                    static_cast<size_t>(wu * esz));
      }
    in += B * n * wu * esz;
  }
}

// The inverse: whole (B, Tg, W / cp) -> local (B, T, W), every rank's slice of the segments for this
// rank's rows.
void GptChunk::Impl::ulysses_to_rows(const Tensor& whole, const Tensor& local, bool qkv_columns, const char* what,
                                     int layer) {
  const Segments seg = segments_of(qkv_columns, Al, int64_t{Gl} * hs);
  const int P = cps;
  const int64_t esz = static_cast<int64_t>(dtype_size(dtype));
  const int64_t wu = seg.slice_width(P);  // the columns rank j gets: slice j of every segment
  const int64_t W = local.dim(2);
  // Send: block i = (B, rank i's rows, wu).
  const Tensor send = staging(u_send, B * Tg * wu), recv = staging(u_recv, int64_t{P} * B * T * wu);
  const char* src = static_cast<const char*>(whole.raw());
  char* out = static_cast<char*>(send.raw());
  std::vector<size_t> sc(static_cast<size_t>(P)), rc(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) {
    const std::vector<int64_t>& p = ring.positions[static_cast<size_t>(i)];
    const int64_t n = static_cast<int64_t>(p.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) {
        std::memcpy(out, src + ((b * Tg + p[static_cast<size_t>(t)]) * wu) * esz, static_cast<size_t>(wu * esz));
        out += wu * esz;
      }
    sc[static_cast<size_t>(i)] = static_cast<size_t>(B * n * wu);
    rc[static_cast<size_t>(i)] = static_cast<size_t>(B * T * wu);
  }
  const auto issued = std::chrono::steady_clock::now();
  comm::wait_or_throw(cp->all_to_all_v(send.raw(), sc, recv.raw(), rc, dtype),
                      std::string("the context-parallel all-to-all of ") + what, comm::WaitGroup::other);
  comm::report_collective_span(std::string("cp all-to-all ") + what + ", h." + std::to_string(layer), issued);
  // Rank j's block: (B, T, wu), slice j of every segment.
  const char* in = static_cast<const char*>(recv.raw());
  char* dst = static_cast<char*>(local.raw());
  for (int j = 0; j < P; ++j)
    for (int64_t row = 0; row < B * T; ++row) {
      const char* from = in + ((int64_t{j} * B * T + row) * wu) * esz;
      for (size_t s = 0; s < seg.offset.size(); ++s) {
        const int64_t w = seg.width[s] / P;
        std::memcpy(dst + (row * W + seg.offset[s] + j * w) * esz, from, static_cast<size_t>(w * esz));
        from += w * esz;
      }
    }
}

void GptChunk::Impl::ulysses_core(Context& ctx, const Tensor& att /*(N,Al)*/, const Tensor& probs,
                                  const Tensor& qkv /*(N,QKVl)*/, const Tensor& qkv_u /*(B*Tg,Wu)*/, int layer) {
  const DropoutMask m = mask(DropoutSite::attention_probs, layer);
  ulysses_to_heads(qkv.view({B, T, QKVl}), qkv_u.view({B, Tg, Wu}), true, "q/k/v", layer);
  ops::attention_forward(ctx, u_att.view({B, Tg, Au}), probs.view({B, Hu, Tg, Tg}), qkv_u.view({B, Tg, Wu}), ulayout,
                         m, u_head0);
  ulysses_to_rows(u_att.view({B, Tg, Au}), att.view({B, T, Al}), false, "attention output", layer);
}

void GptChunk::Impl::ulysses_recompute(Context& ctx, const Tensor& probs, const Tensor& qkv_u, int layer) {
  const DropoutMask m = mask(DropoutSite::attention_probs, layer);
  ops::attention_forward(ctx, u_att.view({B, Tg, Au}), probs.view({B, Hu, Tg, Tg}), qkv_u.view({B, Tg, Wu}), ulayout,
                         m, u_head0);
}

void GptChunk::Impl::ulysses_core_backward(Context& ctx, const Tensor& dqkv /*(N,QKVl)*/, const Tensor& datt /*(N,Al)*/,
                                           const Tensor& qkv_u, const Tensor& probs, int layer) {
  const DropoutMask m = mask(DropoutSite::attention_probs, layer);
  ulysses_to_heads(datt.view({B, T, Al}), u_att.view({B, Tg, Au}), false, "attention output gradient", layer);
  u_dqkv.zero_();
  ops::attention_backward(ctx, u_dqkv.view({B, Tg, Wu}), u_att.view({B, Tg, Au}), qkv_u.view({B, Tg, Wu}),
                          probs.view({B, Hu, Tg, Tg}), ulayout, m, u_head0);
  ulysses_to_rows(u_dqkv.view({B, Tg, Wu}), dqkv.view({B, T, QKVl}), true, "q/k/v gradient", layer);
}

}  // namespace troupe
