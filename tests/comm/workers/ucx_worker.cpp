// One rank of a ucx-backend test job (started N times by tests/comm/test_ucx_comm.cpp, or by hand):
//
//   ucx_worker --rank R --world N --store DIR [--count-scale S] [--kill-rank K]
//              [--check all|all_to_all|a2a-mismatch|kill-target|kill-target-idle|chaos|ucx-fatal|
//              mismatch|bench|soak] [--bench-max BYTES] [--iters I] [--op OP] [--seconds S]
//              [--boot-timeout T]
//              [--rank-env R KEY=VALUE]... [--half-large shm|ring] [--background-waits 1]
//
// --background-waits 1: the main thread's waits are background ones (comm::BackgroundWaits: no
// polling before sleeping), as the offload writer's snapshot copies are.
// --rank-env sets KEY=VALUE in rank R's environment before its world is created (one rank with
// other settings, e.g. a shared-memory segment too small for the groups' staging areas).
// Bootstraps through FileBootstrap on DIR, creates the ucx world and runs:
//   all          every collective against a serial reference: all_reduce (sum, max; f32, f64,
//                i32, i64), reduce_scatter(_v), all_gather(_v) (uneven and zero counts, in place),
//                broadcast from every root, send/recv (interleaved tags, both directions, to self,
//                posted before and after the message arrives), barrier, progress without wait(),
//                concurrent sub-groups and concurrent communicators on two threads. Inputs are
//                small integers in f32 (exact sums), generated from (group rank, index, salt), so
//                every rank computes the expected result exactly and compares bitwise; checksums of
//                results that must agree are compared across ranks at the end. Counts: 0, 1, 7,
//                size-1, 1000, 20000 and, scaled by S (default 1, 0 skips them), 1000003.
//                bf16 and f16 all_reduce and reduce_scatter(_v) (sum, max) of random non-zero
//                values, with Inf, +Inf/-Inf and (finite) overflow at fixed indices, against the
//                rounding rule of the algorithm the contract says runs (tests/comm/
//                half_reference.hpp): below the ring threshold (TROUPE_UCX_RING_THRESHOLD, read
//                here too) recursive doubling (all_reduce) or one rounding (reduce_scatter); above
//                it one rounding (shared-memory path) or the ring's rounding per hop, as
//                --half-large shm|ring says (absent: either, as a whole buffer).
//   all_to_all   all_to_all_v against the serial exchange (tests/comm/all_to_all_reference.hpp):
//                random counts per pair (zeros, odd sizes; blocks up to 700 elements, and up to
//                40000 S with S > 0: rendezvous), f32/f64/i32/bf16, several calls in flight, all
//                zeros, the equal-count shorthand; on the world, the even/odd groups, and the world
//                in reverse order on a second thread while the world runs.
//   a2a-mismatch (3 ranks) all_to_all_v where every rank's recv_counts disagree with one sender:
//                0 -> 1 sends 7 where 5 are expected (eager, truncated), 1 -> 2 sends 3 where 6 are
//                expected (short), 2 -> 0 sends 300000 f32 where 299999 are expected (rendezvous,
//                truncated). Every rank must fail (exit 4) with an error naming its counts, write
//                nothing past its recv, and meet the others at a barrier afterwards (no hang).
//   kill-target  rank K (default N-1) dies by SIGKILL in the middle of a large all_reduce (or
//                all_to_all with --op all_to_all); the others must see an error naming rank K.
//   kill-target-idle  the same, but rank K dies before it joins the all_reduce the others are in.
//   chaos        every kind of traffic for --seconds S (default 2) while the test SIGKILLs some
//                rank from outside: a survivor prints its first failure and exits 3 (after a
//                second, so every survivor meets the death itself, not this rank's exit); a rank
//                that finishes exits 0. --boot-timeout T (default 60 s) bounds the bootstrap's
//                waits (a rank killed during world creation).
//   ucx-fatal    rank 0 makes UCX log a fatal error: it must end with exit code 1 and troupe's
//                message (comm/ucx/ucx_detail.hpp, install_fatal_handler), the others with exit 3.
//   mismatch     a large all_reduce where the last rank passes a larger count than the others:
//                every rank must fail (exit 4) with an error instead of hanging (shared-memory
//                path: the chunks' signatures differ).
//   bench        rank 0 prints time and busbw (nccl-tests convention) of all_reduce,
//                reduce_scatter and all_gather from 4 KiB to --bench-max bytes.
//   soak         one collective (--op all_reduce|reduce_scatter|all_gather) of --bench-max bytes,
//                over and over for --iters calls; rank 0 prints busbw every 100 calls (for
//                looking at a steady state with perf or top).
// Exit codes: 0 ok, 1 a check failed (the message names it), 2 bad usage or setup, 3 a peer failed
// and the error named it (kill-target*, chaos: on the surviving ranks), 4 the mismatch was
// reported.
#include <signal.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap/file_bootstrap.hpp"
#include "comm/ucx/ucx_world.hpp"
#include "tests/comm/all_to_all_reference.hpp"
#include "tests/comm/half_reference.hpp"

using namespace troupe;
using namespace troupe::comm;

namespace {

int g_rank = -1;

[[noreturn]] void fail(const std::string& check, const std::string& detail) {
  std::fprintf(stderr, "ucx_worker rank %d: FAILED check '%s': %s\n", g_rank, check.c_str(),
               detail.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void must(const Status& s, const std::string& check) {
  if (!s.is_ok()) fail(check, s.message());
}

// Small integers (|v| <= 11), exact in every dtype and in sums over up to 8 ranks.
template <class T>
T value(int rank, size_t i, int salt) {
  const int64_t v =
      static_cast<int64_t>(
          (static_cast<uint64_t>(rank) * 131 + i * 17 + static_cast<uint64_t>(salt) * 7) % 23) -
      11;
  return static_cast<T>(v);
}

template <class T>
T combine(T a, T b, ReduceOp op) {
  return op == ReduceOp::sum ? static_cast<T>(a + b) : (a > b ? a : b);
}

uint64_t fnv(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
void compare(const std::string& check, const T* got, const T* want, size_t n) {
  if (n == 0 || std::memcmp(got, want, n * sizeof(T)) == 0) return;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      fail(check, "element " + std::to_string(i) + " of " + std::to_string(n) + " is " +
                      std::to_string(static_cast<double>(got[i])) + ", expected " +
                      std::to_string(static_cast<double>(want[i])));
    }
  }
}

namespace href = troupe::test::half_ref;

// Which rounding rule large 16-bit reductions must follow (--half-large).
enum class HalfLarge { either, once, ring };
HalfLarge g_half_large = HalfLarge::either;
size_t g_ring_threshold = 64 << 10;  // TROUPE_UCX_RING_THRESHOLD, as the world reads it

size_t env_bytes(const char* name, size_t fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  size_t v = std::strtoull(s, &end, 10);
  if (*end == 'k' || *end == 'K') v <<= 10;
  if (*end == 'm' || *end == 'M') v <<= 20;
  if (*end == 'g' || *end == 'G') v <<= 30;
  return v;
}

// A random non-zero 16-bit value from (rank, index, salt): magnitudes 2^-8 .. 2^8, both signs,
// rounded to the format by the reference. Index 3: +Inf on the last rank; index 4: +Inf on rank
// 0 and -Inf on the last (NaN in a sum); index 5: a finite value whose sum over 2+ ranks overflows
// (f16 40000, bf16 3e38).
uint16_t half_value(int rank, int p, size_t i, int salt, DType t) {
  if (i == 3 && rank == p - 1) return href::encode(INFINITY, t);
  if (i == 4 && p > 1 && (rank == 0 || rank == p - 1))
    return href::encode(rank == 0 ? INFINITY : -INFINITY, t);
  if (i == 5) return href::encode(t == DType::f16 ? 40000.0 : 3e38, t);
  uint64_t z = (static_cast<uint64_t>(rank) << 40) ^ (i << 8) ^ static_cast<uint64_t>(salt) ^
               0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const double mant = 1.0 + static_cast<double>(z & 0xffffff) / 16777216.0;
  const int expo = static_cast<int>((z >> 24) % 16) - 8;
  return href::encode(((z >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(mant, expo), t);
}

// Bitwise, or both NaN (NaN payloads are not part of the contract).
bool half_same(uint16_t a, uint16_t b, DType t) {
  return a == b || (href::is_nan(a, t) && href::is_nan(b, t));
}
// The first element where got and want differ, or -1.
long half_mismatch(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, DType t) {
  for (size_t i = 0; i < got.size(); ++i)
    if (!half_same(got[i], want[i], t)) return static_cast<long>(i);
  return -1;
}

// got against the rule(s) that apply: small (below the ring threshold): `small`; large: `once`
// and/or `ring` as --half-large says.
void half_compare(const std::string& check, const std::vector<uint16_t>& got, bool small,
                  const std::vector<uint16_t>& small_want, const std::vector<uint16_t>& once,
                  const std::vector<uint16_t>& ring, DType t) {
  long bad = -1;
  const char* rule = "";
  if (small) {
    bad = half_mismatch(got, small_want, t);
    rule = "small-message rule";
  } else if (g_half_large == HalfLarge::once) {
    bad = half_mismatch(got, once, t);
    rule = "one rounding (shared-memory path)";
  } else if (g_half_large == HalfLarge::ring) {
    bad = half_mismatch(got, ring, t);
    rule = "ring (rounding per hop)";
  } else {
    bad = half_mismatch(got, once, t);
    if (bad >= 0) bad = half_mismatch(got, ring, t);
    rule = "one rounding or ring";
  }
  if (bad >= 0) {
    const size_t i = static_cast<size_t>(bad);
    fail(check, std::string("element ") + std::to_string(i) + " of " + std::to_string(got.size()) +
                    " is " + std::to_string(got[i]) + " (" +
                    std::to_string(href::decode(got[i], t)) + "), not what the " + rule +
                    " gives (once " + std::to_string(once[i]) + ", ring " +
                    std::to_string(ring[i]) + ", small " +
                    std::to_string(small ? small_want[i] : 0) + ")");
  }
}

struct Checker {
  std::vector<uint64_t> agreed;  // checksums every rank of the world must share, in order

  void all_reduce_half(Communicator& c, const std::string& tag, size_t count, DType t, ReduceOp op,
                       int salt, bool shared) {
    const int p = c.size();
    const std::string check = tag + " all_reduce " + reduce_op_name(op) + " " + dtype_name(t) +
                              " count " + std::to_string(count);
    std::vector<uint16_t> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = half_value(c.rank(), p, i, salt, t);
    must(c.all_reduce(buf.data(), count, t, op)->wait(), check);
    // The ring's blocks: count cut into p, the first count % p one longer.
    std::vector<uint16_t> once(count), ring(count), tree(count), xs(static_cast<size_t>(p));
    const size_t base = count / static_cast<size_t>(p), rem = count % static_cast<size_t>(p);
    for (size_t i = 0, b = 0, end = base + (rem > 0); i < count; ++i) {
      while (i >= end) {
        ++b;
        end += base + (b < rem);
      }
      for (int q = 0; q < p; ++q) xs[static_cast<size_t>(q)] = half_value(q, p, i, salt, t);
      once[i] = href::reduce_once(xs, t, op);
      ring[i] = href::reduce_ring(xs, static_cast<int>(b), t, op);
      tree[i] = href::reduce_tree(xs, t, op);
    }
    half_compare(check, buf, count * 2 < g_ring_threshold, tree, once, ring, t);
    if (op == ReduceOp::sum && p > 1 && count > 5) {  // the specials, whatever the algorithm
      if (buf[3] != href::encode(INFINITY, t)) fail(check, "an Inf input did not give Inf");
      if (!href::is_nan(buf[4], t)) fail(check, "+Inf and -Inf did not give NaN");
      if (buf[5] != href::encode(INFINITY, t)) fail(check, "an overflowing sum is not Inf");
    }
    if (shared) agreed.push_back(fnv(buf.data(), count * sizeof(uint16_t)));
  }

  void reduce_scatter_half(Communicator& c, const std::string& tag,
                           const std::vector<size_t>& counts, bool in_place, DType t, ReduceOp op,
                           int salt) {
    const int p = c.size();
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const std::string check = tag + " reduce_scatter_v " + reduce_op_name(op) + " " +
                              dtype_name(t) + (in_place ? " in place" : "") + " total " +
                              std::to_string(total);
    size_t off = 0;
    for (int q = 0; q < c.rank(); ++q) off += counts[static_cast<size_t>(q)];
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    std::vector<uint16_t> send(total), recv(mine, 0xFFFF);
    for (size_t i = 0; i < total; ++i) send[i] = half_value(c.rank(), p, i, salt, t);
    uint16_t* out = in_place ? send.data() + off : recv.data();
    must(c.reduce_scatter_v(send.data(), out, counts, t, op)->wait(), check);
    std::vector<uint16_t> got(out, out + mine), once(mine), ring(mine), xs(static_cast<size_t>(p));
    for (size_t i = 0; i < mine; ++i) {
      for (int q = 0; q < p; ++q) xs[static_cast<size_t>(q)] = half_value(q, p, off + i, salt, t);
      once[i] = href::reduce_once(xs, t, op);
      ring[i] = href::reduce_ring(xs, c.rank(), t, op);
    }
    half_compare(check, got, total * 2 < g_ring_threshold, once, once, ring, t);
  }

  template <class T>
  void all_reduce(Communicator& c, const std::string& tag, size_t count, ReduceOp op, int salt,
                  bool shared) {
    const std::string check = tag + " all_reduce " + reduce_op_name(op) + " " +
                              dtype_name(dtype_of<T>()) + " count " + std::to_string(count);
    std::vector<T> buf(count), want(count);
    for (size_t i = 0; i < count; ++i) buf[i] = value<T>(c.rank(), i, salt);
    must(c.all_reduce(buf.data(), count, dtype_of<T>(), op)->wait(), check);
    for (size_t i = 0; i < count; ++i) {
      T acc = value<T>(0, i, salt);
      for (int q = 1; q < c.size(); ++q) acc = combine(acc, value<T>(q, i, salt), op);
      want[i] = acc;
    }
    compare(check, buf.data(), want.data(), count);
    if (shared) agreed.push_back(fnv(buf.data(), count * sizeof(T)));
  }

  void reduce_scatter(Communicator& c, const std::string& tag, const std::vector<size_t>& counts,
                      bool in_place, ReduceOp op, int salt) {
    const std::string check =
        tag + " reduce_scatter_v " + reduce_op_name(op) + (in_place ? " in place" : "") +
        " total " + std::to_string(std::accumulate(counts.begin(), counts.end(), size_t{0}));
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    size_t off = 0;
    for (int q = 0; q < c.rank(); ++q) off += counts[static_cast<size_t>(q)];
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    std::vector<float> send(total), recv(mine, -99.0f), want(mine);
    for (size_t i = 0; i < total; ++i) send[i] = value<float>(c.rank(), i, salt);
    float* out = in_place ? send.data() + off : recv.data();
    must(c.reduce_scatter_v(send.data(), out, counts, DType::f32, op)->wait(), check);
    for (size_t i = 0; i < mine; ++i) {
      float acc = value<float>(0, off + i, salt);
      for (int q = 1; q < c.size(); ++q) acc = combine(acc, value<float>(q, off + i, salt), op);
      want[i] = acc;
    }
    compare(check, out, want.data(), mine);
  }

  void all_gather(Communicator& c, const std::string& tag, const std::vector<size_t>& counts,
                  bool in_place, int salt, bool shared) {
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    const std::string check =
        tag + " all_gather_v" + (in_place ? " in place" : "") + " total " + std::to_string(total);
    size_t off = 0;
    for (int q = 0; q < c.rank(); ++q) off += counts[static_cast<size_t>(q)];
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    std::vector<float> send(mine), recv(total, -99.0f), want(total);
    for (size_t i = 0; i < mine; ++i) send[i] = value<float>(c.rank(), i, salt);
    if (in_place)
      std::copy(send.begin(), send.end(), recv.begin() + static_cast<std::ptrdiff_t>(off));
    const float* src = in_place ? recv.data() + off : send.data();
    must(c.all_gather_v(src, recv.data(), counts, DType::f32)->wait(), check);
    size_t o = 0;
    for (int q = 0; q < c.size(); ++q) {
      for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i)
        want[o + i] = value<float>(q, i, salt);
      o += counts[static_cast<size_t>(q)];
    }
    compare(check, recv.data(), want.data(), total);
    if (shared) agreed.push_back(fnv(recv.data(), total * sizeof(float)));
  }

  template <class T>
  void broadcast(Communicator& c, const std::string& tag, size_t count, int root, int salt,
                 bool shared) {
    const std::string check = tag + " broadcast " + dtype_name(dtype_of<T>()) + " count " +
                              std::to_string(count) + " root " + std::to_string(root);
    std::vector<T> buf(count, static_cast<T>(99)), want(count);
    for (size_t i = 0; i < count; ++i) {
      want[i] = value<T>(root, i, salt);
      if (c.rank() == root) buf[i] = want[i];
    }
    must(c.broadcast(buf.data(), count, dtype_of<T>(), root)->wait(), check);
    compare(check, buf.data(), want.data(), count);
    if (shared) agreed.push_back(fnv(buf.data(), count * sizeof(T)));
  }

  // Every rank exchanges with every rank (itself included) two messages on each of three tags of
  // different sizes; receives are posted in another order than the sends. With late_receives, the
  // sends go first and a barrier passes before any receive is posted (the unexpected-message path).
  void send_recv(Communicator& c, const std::string& tag, size_t large, bool late_receives) {
    const std::string check =
        tag + (late_receives ? " send/recv (receives after arrival)" : " send/recv");
    const uint64_t tags[3] = {5, uint64_t{1} << 40, (uint64_t{1} << 56) - 1};
    const size_t sizes[3] = {0, 3, large};
    const int p = c.size();
    const int r = c.rank();
    auto content = [&](int from, int to, int t, int k, size_t i) {
      return static_cast<float>((from * 1000 + to * 100 + t * 10 + k) % 4093) +
             static_cast<float>(i % 7);
    };
    struct Slot {
      int peer, t, k;
      std::vector<float> data;
    };
    std::vector<Slot> out, in;
    for (int q = 0; q < p; ++q) {
      for (int t = 0; t < 3; ++t) {
        for (int k = 0; k < 2; ++k) {
          Slot s{q, t, k, std::vector<float>(sizes[t])};
          for (size_t i = 0; i < sizes[t]; ++i) s.data[i] = content(r, q, t, k, i);
          out.push_back(std::move(s));
          in.push_back(Slot{q, t, k, std::vector<float>(sizes[t], -1.0f)});
        }
      }
    }
    std::vector<WorkPtr> works;
    auto post_recvs = [&] {
      // Reverse tag order, messages of one tag in order (matching is in send order per tag).
      for (int i = static_cast<int>(in.size()) - 1; i >= 0; --i) {
        Slot& s = in[static_cast<size_t>(i)];
        if (s.k != 0) continue;
        works.push_back(c.recv(s.data.data(), s.data.size(), DType::f32, s.peer, tags[s.t]));
        Slot& s2 = in[static_cast<size_t>(i) + 1];
        works.push_back(c.recv(s2.data.data(), s2.data.size(), DType::f32, s2.peer, tags[s2.t]));
      }
    };
    if (!late_receives) post_recvs();
    for (Slot& s : out)
      works.push_back(c.send(s.data.data(), s.data.size(), DType::f32, s.peer, tags[s.t]));
    if (late_receives) {
      // Sends of eager size are complete now; rendezvous ones complete once received.
      must(c.barrier()->wait(), check + " barrier");
      post_recvs();
    }
    must(wait_all(works), check);
    for (const Slot& s : in) {
      for (size_t i = 0; i < s.data.size(); ++i) {
        if (s.data[i] != content(s.peer, r, s.t, s.k, i)) {
          fail(check, "message " + std::to_string(s.k) + " from rank " + std::to_string(s.peer) +
                          " tag " + std::to_string(tags[s.t]) + " element " + std::to_string(i) +
                          " is wrong");
        }
      }
    }
  }
};

std::vector<size_t> uneven_counts(int p, size_t base, int salt) {
  std::vector<size_t> counts(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) {
    const size_t k = static_cast<size_t>((q * 3 + salt) % 5);
    counts[static_cast<size_t>(q)] = k == 0 ? 0 : base + k * 13;  // some ranks contribute nothing
  }
  return counts;
}

void run_suite(Checker& ch, Communicator& c, const std::string& tag, size_t large, bool shared) {
  const int p = c.size();
  std::vector<size_t> counts = {0, 1, 7, static_cast<size_t>(std::max(p - 1, 1)), 1000, 20000};
  if (large > 0) counts.push_back(large);
  int salt = 0;
  for (size_t n : counts) {
    ch.all_reduce<float>(c, tag, n, ReduceOp::sum, ++salt, shared);
    ch.all_reduce<float>(c, tag, n, ReduceOp::max, ++salt, shared);
  }
  ch.all_reduce<double>(c, tag, 20000, ReduceOp::sum, ++salt, shared);
  ch.all_reduce<int32_t>(c, tag, 7, ReduceOp::sum, ++salt, shared);
  ch.all_reduce<int64_t>(c, tag, 20000, ReduceOp::max, ++salt, shared);
  for (DType t : {DType::bf16, DType::f16}) {
    for (size_t n : counts) {
      ch.all_reduce_half(c, tag, n, t, ReduceOp::sum, ++salt, shared);
      ch.all_reduce_half(c, tag, n, t, ReduceOp::max, ++salt, shared);
    }
  }

  std::vector<size_t> bases = {0, 1, 3, 5000};
  if (large > 0) bases.push_back(large / static_cast<size_t>(p));
  for (size_t base : bases) {
    const std::vector<size_t> equal(static_cast<size_t>(p), base);
    const std::vector<size_t> uneven = uneven_counts(p, base, salt);
    ch.reduce_scatter(c, tag, equal, false, ReduceOp::sum, ++salt);
    ch.reduce_scatter(c, tag, uneven, false, ReduceOp::sum, ++salt);
    ch.reduce_scatter(c, tag, uneven, true, ReduceOp::max, ++salt);
    for (DType t : {DType::bf16, DType::f16}) {
      ch.reduce_scatter_half(c, tag, equal, false, t, ReduceOp::sum, ++salt);
      ch.reduce_scatter_half(c, tag, uneven, true, t, ReduceOp::sum, ++salt);
      ch.reduce_scatter_half(c, tag, uneven, false, t, ReduceOp::max, ++salt);
    }
    ch.all_gather(c, tag, equal, false, ++salt, shared);
    ch.all_gather(c, tag, uneven, false, ++salt, shared);
    ch.all_gather(c, tag, uneven, true, ++salt, shared);
  }
  // The equal-count shorthands.
  {
    std::vector<float> send(static_cast<size_t>(p) * 4), recv(4);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value<float>(c.rank(), i, 77);
    must(c.reduce_scatter(send.data(), recv.data(), 4, DType::f32, ReduceOp::sum)->wait(),
         tag + " reduce_scatter");
    for (size_t i = 0; i < 4; ++i) {
      float want = value<float>(0, static_cast<size_t>(c.rank()) * 4 + i, 77);
      for (int q = 1; q < p; ++q)
        want += value<float>(q, static_cast<size_t>(c.rank()) * 4 + i, 77);
      if (recv[i] != want) fail(tag + " reduce_scatter", "wrong element " + std::to_string(i));
    }
    std::vector<float> all(static_cast<size_t>(p) * 4);
    must(c.all_gather(recv.data(), all.data(), 4, DType::f32)->wait(), tag + " all_gather");
    if (shared) ch.agreed.push_back(fnv(all.data(), all.size() * sizeof(float)));
  }
  for (int root = 0; root < p; ++root) {
    ch.broadcast<float>(c, tag, 1, root, ++salt, shared);
    ch.broadcast<uint8_t>(c, tag, 1001, root, ++salt, shared);
  }
  ch.broadcast<float>(c, tag, 20000, p - 1, ++salt, shared);
  if (large > 0) {
    ch.broadcast<float>(c, tag, large, 0, ++salt, shared);
    ch.broadcast<float>(c, tag, large, p / 2, ++salt, shared);
  }
  ch.send_recv(c, tag, 20000, false);
  ch.send_recv(c, tag, 20000, true);
  for (int i = 0; i < 3; ++i) must(c.barrier()->wait(), tag + " barrier");
  // Progress without the caller: an operation completes while nobody waits for it.
  {
    const size_t n = large > 0 ? large : 100000;
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = value<float>(c.rank(), i, 200);
    WorkPtr w = c.all_reduce(buf.data(), n, DType::f32, ReduceOp::sum);
    const auto t0 = std::chrono::steady_clock::now();
    while (!w->test() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!w->test())
      fail(tag + " background progress", "all_reduce did not complete without wait()");
    must(w->wait(), tag + " background progress");
    for (size_t i = 0; i < n; i += 997) {
      float want = value<float>(0, i, 200);
      for (int q = 1; q < p; ++q) want += value<float>(q, i, 200);
      if (buf[i] != want) fail(tag + " background progress", "wrong element " + std::to_string(i));
    }
  }
  // Several operations in flight at once, waited for together.
  {
    const size_t n = 30000;
    std::vector<std::vector<float>> bufs(4, std::vector<float>(n));
    std::vector<WorkPtr> works;
    for (size_t k = 0; k < bufs.size(); ++k) {
      for (size_t i = 0; i < n; ++i)
        bufs[k][i] = value<float>(c.rank(), i, 100 + static_cast<int>(k));
      works.push_back(c.all_reduce(bufs[k].data(), n, DType::f32, ReduceOp::sum));
      works.push_back(c.barrier());
    }
    must(wait_all(works), tag + " overlapping all_reduce");
    for (size_t k = 0; k < bufs.size(); ++k) {
      for (size_t i = 0; i < n; ++i) {
        float want = value<float>(0, i, 100 + static_cast<int>(k));
        for (int q = 1; q < p; ++q) want += value<float>(q, i, 100 + static_cast<int>(k));
        if (bufs[k][i] != want)
          fail(tag + " overlapping all_reduce", "wrong element " + std::to_string(i));
      }
    }
  }
}

int check_all(CommWorld& world, size_t large) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  if (all.backend() != "ucx" || all.size() != world.size() || all.rank() != world.rank()) {
    fail("everyone()", "wrong backend, size or rank");
  }
  Checker ch;
  run_suite(ch, all, "world", large, true);

  // Even and odd ranks in two disjoint groups at the same time.
  const int n = world.size();
  std::vector<int> mine;
  for (int r = world.rank() % 2; r < n; r += 2) mine.push_back(r);
  auto half = world.group(mine);
  must(half.status().is_ok() ? Status::ok() : half.status(), "group(even/odd)");
  Checker sub;
  run_suite(sub, **half, world.rank() % 2 ? "odd" : "even", large / 3, false);

  // Two communicators of this rank (the world, and the world in reverse order) used concurrently.
  std::vector<int> reversed(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) reversed[static_cast<size_t>(i)] = n - 1 - i;
  auto rev = world.group(reversed);
  must(rev.status().is_ok() ? Status::ok() : rev.status(), "group(reversed)");
  Checker other;
  std::thread t([&] {
    for (int k = 0; k < 3; ++k)
      other.all_reduce<float>(**rev, "reversed", 70001, ReduceOp::sum, 300 + k, false);
    other.send_recv(**rev, "reversed", 5000, false);
  });
  for (int k = 0; k < 3; ++k)
    ch.all_reduce<float>(all, "world+reversed", 50001, ReduceOp::sum, 400 + k, true);
  ch.broadcast<float>(all, "world+reversed", 100, 0, 500, true);
  t.join();

  // Every rank must hold bitwise the same results: compare the checksums across the world.
  std::vector<int64_t> mine_sums(ch.agreed.begin(), ch.agreed.end());
  const size_t k = mine_sums.size();
  std::vector<int64_t> every(k * static_cast<size_t>(n));
  must(all.all_gather(mine_sums.data(), every.data(), k, DType::i64)->wait(), "checksum exchange");
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < k; ++i) {
      if (every[static_cast<size_t>(q) * k + i] != mine_sums[i]) {
        fail("results identical on all ranks",
             "result #" + std::to_string(i) + " differs between rank " +
                 std::to_string(world.rank()) + " and rank " + std::to_string(q));
      }
    }
  }
  must(all.barrier()->wait(), "final barrier");
  std::printf("ucx_worker rank %d/%d: all checks passed (%zu shared results)\n", world.rank(), n,
              k);
  return 0;
}

namespace a2a = troupe::test::a2a;

[[noreturn]] void usage(const char* msg);

// all_to_all_v cases of one dtype on `c`, all in flight at once, each rank's recv against the
// serial exchange of every rank's send buffer (each process builds them all from the seed).
void all_to_all_cases(Communicator& c, const std::string& tag, DType dtype, size_t large,
                      uint64_t seed) {
  const int p = c.size(), r = c.rank();
  const size_t esz = dtype_size(dtype);
  std::vector<a2a::Case> cases;
  cases.push_back(a2a::make_case(a2a::random_counts(p, seed, 37), esz, seed));
  cases.push_back(a2a::make_case(a2a::random_counts(p, seed + 1, 700), esz, seed + 1));
  if (large > 0)
    cases.push_back(a2a::make_case(a2a::random_counts(p, seed + 2, large), esz, seed + 2));
  cases.push_back(a2a::make_case(a2a::equal_counts(p, 0), esz, seed + 3));
  std::vector<a2a::Bytes> recvs;
  std::vector<WorkPtr> works;
  for (const a2a::Case& k : cases) {
    const std::vector<size_t> rc = a2a::recv_counts(k.counts, r);
    recvs.emplace_back(a2a::total(rc) * esz + 64, 0xCD);
    works.push_back(c.all_to_all_v(k.sends[static_cast<size_t>(r)].data(),
                                   a2a::send_counts(k.counts, r), recvs.back().data(), rc, dtype));
  }
  const std::string check = tag + " all_to_all_v " + dtype_name(dtype);
  must(wait_all(works), check);
  for (size_t k = 0; k < cases.size(); ++k) {
    const a2a::Bytes& want = cases[k].expected[static_cast<size_t>(r)];
    const std::string what = check + " case " + std::to_string(k);
    for (size_t i = want.size(); i < recvs[k].size(); ++i)
      if (recvs[k][i] != 0xCD) fail(what, "a byte past recv was written");
    recvs[k].resize(want.size());
    const std::string diff = a2a::first_difference(recvs[k], want, esz);
    if (!diff.empty()) fail(what, diff);
  }
}

void all_to_all_suite(Communicator& c, const std::string& tag, size_t large, uint64_t seed) {
  int d = 0;
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::bf16})
    all_to_all_cases(c, tag, t, large, seed + 10 * static_cast<uint64_t>(d++));
  const a2a::Case eq = a2a::make_case(a2a::equal_counts(c.size(), 5), 4, seed + 99);
  a2a::Bytes out(eq.expected[static_cast<size_t>(c.rank())].size());
  must(c.all_to_all(eq.sends[static_cast<size_t>(c.rank())].data(), out.data(), 5, DType::i32)
           ->wait(),
       tag + " all_to_all");
  if (out != eq.expected[static_cast<size_t>(c.rank())])
    fail(tag + " all_to_all", "the equal-count shorthand's result is wrong");
}

int check_all_to_all(CommWorld& world, double scale) {
  const size_t large = scale > 0 ? static_cast<size_t>(40000 * scale) : 0;
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  all_to_all_suite(all, "world", large, 1);
  const int n = world.size();
  std::vector<int> mine;
  for (int r = world.rank() % 2; r < n; r += 2) mine.push_back(r);
  auto half = world.group(mine);
  must(half.status().is_ok() ? Status::ok() : half.status(), "group(even/odd)");
  all_to_all_suite(**half, world.rank() % 2 ? "odd" : "even", large / 3, 1000 + mine.size());
  // Two communicators of this rank at once: the world, and the world in reverse on a thread.
  std::vector<int> reversed(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) reversed[static_cast<size_t>(i)] = n - 1 - i;
  auto rev = world.group(reversed);
  must(rev.status().is_ok() ? Status::ok() : rev.status(), "group(reversed)");
  std::thread t([&] { all_to_all_suite(**rev, "reversed", large / 2, 2000); });
  all_to_all_suite(all, "world+reversed", large / 2, 3000);
  t.join();
  must(all.barrier()->wait(), "final barrier");
  std::printf("ucx_worker rank %d/%d: all_to_all checks passed\n", world.rank(), n);
  return 0;
}

int check_a2a_mismatch(CommWorld& world) {
  if (world.size() != 3) usage("--check a2a-mismatch runs on 3 ranks");
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  a2a::Matrix sends = a2a::random_counts(3, 42, 20);
  sends[0][1] = 7;
  sends[1][2] = 3;
  sends[2][0] = 300000;
  a2a::Matrix expected = sends;
  expected[0][1] = 5;
  expected[1][2] = 6;
  expected[2][0] = 299999;
  const int r = world.rank();
  const a2a::Bytes send = a2a::send_buffer(sends, r, 4, 42);
  const std::vector<size_t> rc = a2a::recv_counts(expected, r);
  const size_t bytes = a2a::total(rc) * 4;
  a2a::Bytes recv(bytes + 4096, 0xCD);
  const Status s =
      all.all_to_all_v(send.data(), a2a::send_counts(sends, r), recv.data(), rc, DType::f32)
          ->wait();
  for (size_t i = bytes; i < recv.size(); ++i)
    if (recv[i] != 0xCD) fail("a2a-mismatch", "a byte past recv was written");
  if (s.is_ok()) fail("a2a-mismatch", "an all_to_all_v with disagreeing counts succeeded");
  std::fprintf(stderr, "ucx_worker rank %d: mismatch reported: %s\n", r, s.message().c_str());
  std::fflush(stderr);
  must(all.barrier()->wait(), "barrier after the mismatch");
  return 4;
}

// idle: the target dies while the others wait for it inside the all_reduce, before it sent
// anything.
// op: all_reduce, or all_to_all (--op).
int check_kill(CommWorld& world, int target, bool idle, const std::string& op) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  must(all.barrier()->wait(), "barrier before the kill");
  const size_t n = 4 << 20;  // 16 MiB of f32: long enough to be in the middle of it
  std::vector<float> buf(n, 1.0f), out(op == "all_to_all" ? n : 0);
  const size_t per_peer = n / static_cast<size_t>(world.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (int iter = 0; iter < 1000; ++iter) {
    if (world.rank() == target && idle) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::fprintf(stderr,
                   "ucx_worker rank %d: dying now (SIGKILL) while the others wait in an %s\n",
                   target, op.c_str());
      std::fflush(stderr);
      raise(SIGKILL);
    }
    WorkPtr w = op == "all_to_all" ? all.all_to_all(buf.data(), out.data(), per_peer, DType::f32)
                                   : all.all_reduce(buf.data(), n, DType::f32, ReduceOp::sum);
    if (world.rank() == target) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::fprintf(stderr, "ucx_worker rank %d: dying now (SIGKILL) in the middle of an %s\n",
                   target, op.c_str());
      std::fflush(stderr);
      raise(SIGKILL);
    }
    Status s = w->wait();
    if (!s.is_ok()) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string needle = "rank " + std::to_string(target);
      std::fprintf(stderr, "ucx_worker rank %d: %s failed after %.2f s: %s\n", world.rank(),
                   op.c_str(), secs, s.message().c_str());
      if (s.message().find(needle) == std::string::npos)
        fail("peer failure", "the error does not name " + needle);
      return 3;
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) break;
  }
  fail("peer failure", op + " kept succeeding although rank " + std::to_string(target) + " died");
}

// Traffic of every kind for `seconds` (small and large collectives of the world and of a second
// group on another thread, large and small send/recv around a ring), while the test kills some rank
// from outside at a random moment: a survivor's first failure must come from a dead peer (exit 3,
// printing the message), never from UCX itself. A rank that finishes its traffic destroys its world
// and exits 0 (a kill during teardown). Results are checked where that is cheap (the all_reduce).
int chaos(CommWorld& world, double seconds) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  const int n = world.size(), r = world.rank();
  std::vector<int> reversed(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) reversed[static_cast<size_t>(i)] = n - 1 - i;
  auto rev = world.group(reversed);
  must(rev.status().is_ok() ? Status::ok() : rev.status(), "group(reversed)");
  auto peer_failed = [&](const Status& s) {
    std::fprintf(stderr, "ucx_worker rank %d: peer failure: %s\n", r, s.message().c_str());
    std::fflush(stderr);
    // Stay a moment (the world still up), so every survivor meets the death itself rather than
    // this rank's exit.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::_Exit(3);
  };
  auto ok = [&](const Status& s) {
    if (!s.is_ok()) peer_failed(s);
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  // The second group: all_reduce and large send/recv on another thread.
  std::thread side([&] {
    Communicator& c = **rev;
    const size_t big = 300001;
    std::vector<float> a(big), in(big), out(big, 1.0f);
    for (;;) {
      // Every member stops after the same call: once any of them is past the deadline.
      a[0] = std::chrono::steady_clock::now() < deadline ? 0.0f : 1.0f;
      ok(c.all_reduce(a.data(), 70001, DType::f32, ReduceOp::max)->wait());
      if (a[0] != 0.0f) break;
      std::vector<WorkPtr> w;
      w.push_back(c.recv(in.data(), big, DType::f32, (c.rank() + c.size() - 1) % c.size(), 9));
      w.push_back(c.send(out.data(), big, DType::f32, (c.rank() + 1) % c.size(), 9));
      ok(wait_all(w));
    }
  });
  const size_t large = 1 << 20;
  std::vector<float> buf(large), gather(large), in(large), out(large, 2.0f);
  for (int iter = 0;; ++iter) {
    float small[7] = {std::chrono::steady_clock::now() < deadline ? 0.0f : 1.0f, 2, 3, 4, 5, 6, 7};
    ok(all.all_reduce(small, 7, DType::f32, ReduceOp::max)->wait());
    if (small[0] != 0.0f) break;
    for (size_t i = 0; i < large; ++i) buf[i] = value<float>(r, i, iter);
    ok(all.all_reduce(buf.data(), large, DType::f32, ReduceOp::sum)->wait());
    for (size_t i = 0; i < large; i += 4099) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value<float>(q, i, iter);
      if (buf[i] != want) fail("chaos all_reduce", "wrong element " + std::to_string(i));
    }
    ok(all.broadcast(buf.data(), large, DType::f32, iter % n)->wait());
    ok(all.all_gather(buf.data(), gather.data(), large / static_cast<size_t>(n), DType::f32)
           ->wait());
    ok(all.reduce_scatter(buf.data(), gather.data(), large / static_cast<size_t>(n), DType::f32,
                          ReduceOp::sum)
           ->wait());
    ok(all.all_to_all(buf.data(), gather.data(), large / static_cast<size_t>(n), DType::f32)
           ->wait());
    std::vector<WorkPtr> w;
    const size_t bytes = iter % 2 ? large : 3;  // rendezvous and eager
    w.push_back(all.recv(in.data(), bytes, DType::f32, (r + n - 1) % n, 1));
    w.push_back(all.send(out.data(), bytes, DType::f32, (r + 1) % n, 1));
    ok(wait_all(w));
    ok(all.barrier()->wait());
  }
  side.join();
  std::printf("ucx_worker rank %d: chaos traffic finished\n", r);
  return 0;
}

// Rank 0 makes UCX log a fatal error (as UCX does before it aborts): troupe's handler must end the
// process with exit code 1 and one line of its own; the others must see rank 0 fail (exit 3).
int ucx_fatal(CommWorld& world) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  must(all.barrier()->wait(), "barrier");
  if (world.rank() == 0) {
    ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_FATAL,
                     &ucs_global_opts.log_component, "injected by ucx_worker --check ucx-fatal");
    fail("ucx-fatal", "the process lived on after UCX's fatal error");
  }
  Status s = all.barrier()->wait();
  if (s.is_ok()) fail("ucx-fatal", "a barrier with the dead rank 0 succeeded");
  std::fprintf(stderr, "ucx_worker rank %d: peer failure: %s\n", world.rank(), s.message().c_str());
  return 3;
}

// The last rank calls all_reduce with more elements than the others; everyone must get an error.
int check_mismatch(CommWorld& world) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& all = **everyone;
  const size_t n = (1 << 20) + (world.rank() == world.size() - 1 ? 4096 : 0);
  std::vector<float> buf(n, 1.0f);
  Status s = all.all_reduce(buf.data(), n, DType::f32, ReduceOp::sum)->wait();
  if (s.is_ok()) fail("mismatch", "an all_reduce with disagreeing counts succeeded");
  std::fprintf(stderr, "ucx_worker rank %d: mismatch reported: %s\n", world.rank(),
               s.message().c_str());
  return 4;
}

int bench(CommWorld& world, size_t max_bytes, int iters) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& c = **everyone;
  const int p = c.size();
  const size_t max_count = max_bytes / sizeof(float);
  std::vector<float> a(max_count, 1.0f), b(max_count, 0.0f);
  if (c.rank() == 0) {
    std::printf("# ucx bench: %d ranks; time per op (us) and busbw (GB/s)\n", p);
    std::printf("%12s %12s %10s %12s %10s %12s %10s\n", "bytes", "allreduce", "busbw", "reducescat",
                "busbw", "allgather", "busbw");
  }
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const size_t block = count / static_cast<size_t>(p);
    double us[3];
    for (int kind = 0; kind < 3; ++kind) {
      const int n_iter = std::max(
          2, static_cast<int>(std::min<size_t>(static_cast<size_t>(iters), (256u << 20) / bytes)));
      auto run = [&] {
        WorkPtr w;
        if (kind == 0) w = c.all_reduce(a.data(), count, DType::f32, ReduceOp::sum);
        if (kind == 1) w = c.reduce_scatter(a.data(), b.data(), block, DType::f32, ReduceOp::sum);
        if (kind == 2) w = c.all_gather(a.data(), b.data(), block, DType::f32);
        must(w->wait(), "bench");
      };
      run();
      must(c.barrier()->wait(), "bench barrier");
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n_iter; ++i) run();
      double t =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n_iter;
      // The slowest rank's time counts.
      must(c.all_reduce(&t, 1, DType::f64, ReduceOp::max)->wait(), "bench time");
      us[kind] = t * 1e6;
    }
    if (c.rank() == 0) {
      const double f = static_cast<double>(p - 1) / p;
      std::printf("%12zu %12.1f %10.2f %12.1f %10.2f %12.1f %10.2f\n", bytes, us[0],
                  bytes / us[0] * 1e-3 * 2 * f, us[1], bytes / us[1] * 1e-3 * f, us[2],
                  bytes / us[2] * 1e-3 * f);
      std::fflush(stdout);
    }
  }
  return 0;
}

int soak(CommWorld& world, const std::string& op, size_t bytes, int iters) {
  auto everyone = world.everyone();
  must(everyone.status().is_ok() ? Status::ok() : everyone.status(), "everyone()");
  Communicator& c = **everyone;
  const int p = c.size();
  const size_t count = bytes / sizeof(float), block = count / static_cast<size_t>(p);
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= iters; ++i) {
    WorkPtr w;
    if (op == "all_reduce") w = c.all_reduce(a.data(), count, DType::f32, ReduceOp::sum);
    if (op == "reduce_scatter")
      w = c.reduce_scatter(a.data(), b.data(), block, DType::f32, ReduceOp::sum);
    if (op == "all_gather") w = c.all_gather(a.data(), b.data(), block, DType::f32);
    if (w == nullptr) fail("soak", "unknown --op " + op);
    must(w->wait(), "soak");
    if (i % 100 == 0 && c.rank() == 0) {
      const auto t1 = std::chrono::steady_clock::now();
      const double us = std::chrono::duration<double>(t1 - t0).count() / 100 * 1e6;
      const double f = (op == "all_reduce" ? 2.0 : 1.0) * (p - 1) / p;
      std::printf("%s %zu bytes: %.1f us, busbw %.2f GB/s\n", op.c_str(), bytes, us,
                  static_cast<double>(bytes) / us * 1e-3 * f);
      std::fflush(stdout);
      t0 = t1;
    }
  }
  return 0;
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "ucx_worker: %s\nusage: ucx_worker --rank R --world N --store DIR [--count-scale S] "
               "[--check all|all_to_all|a2a-mismatch|kill-target|kill-target-idle|chaos|ucx-fatal|"
               "mismatch|bench|soak] "
               "[--kill-rank K] "
               "[--bench-max BYTES] [--iters I] [--op OP] [--seconds S] [--boot-timeout T] "
               "[--rank-env R KEY=VALUE]... [--half-large shm|ring] [--background-waits 1]\n",
               msg);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, world_size = -1, kill_rank = -1, iters = 20;
  std::string store, check = "all";
  std::vector<std::pair<int, std::string>> rank_env;
  std::string soak_op = "all_reduce";
  double scale = 1.0, seconds = 2.0, boot_timeout = 60.0;
  bool background = false;
  size_t bench_max = 64u << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--rank")
      rank = std::atoi(v);
    else if (a == "--world")
      world_size = std::atoi(v);
    else if (a == "--store")
      store = v;
    else if (a == "--count-scale")
      scale = std::atof(v);
    else if (a == "--check")
      check = v;
    else if (a == "--kill-rank")
      kill_rank = std::atoi(v);
    else if (a == "--bench-max")
      bench_max = static_cast<size_t>(std::atoll(v));
    else if (a == "--seconds")
      seconds = std::atof(v);
    else if (a == "--boot-timeout")
      boot_timeout = std::atof(v);
    else if (a == "--iters")
      iters = std::atoi(v);
    else if (a == "--op")
      soak_op = v;
    else if (a == "--half-large")
      g_half_large = std::string(v) == "shm" ? HalfLarge::once
                     : std::string(v) == "ring"
                         ? HalfLarge::ring
                         : (usage("--half-large takes shm or ring"), HalfLarge::either);
    else if (a == "--background-waits")
      background = std::string(v) == "1";
    else if (a == "--rank-env" && i + 1 < argc)
      rank_env.emplace_back(std::atoi(v), argv[++i]);
    else
      usage(("unknown option " + a).c_str());
  }
  if (rank < 0 || world_size < 1 || store.empty())
    usage("--rank, --world and --store are required");
  g_rank = rank;
  g_ring_threshold = env_bytes("TROUPE_UCX_RING_THRESHOLD", g_ring_threshold);
  for (const auto& [r, kv] : rank_env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) usage("--rank-env needs KEY=VALUE");
    if (r == rank) ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  auto boot = FileBootstrap::create(
      store, rank, world_size,
      FileBootstrapOptions{std::chrono::milliseconds(static_cast<int64_t>(boot_timeout * 1000))});
  if (!boot.is_ok()) {
    std::fprintf(stderr, "ucx_worker rank %d: %s\n", rank, boot.status().message().c_str());
    return 2;
  }
  auto world = create_ucx_world(**boot);
  if (!world.is_ok()) {
    std::fprintf(stderr, "ucx_worker rank %d: %s\n", rank, world.status().message().c_str());
    std::fflush(stderr);
    // With peers that still create their worlds (chaos: one of them died), stay a moment, so they
    // meet that death themselves rather than this rank's exit.
    if (check == "chaos") std::this_thread::sleep_for(std::chrono::seconds(1));
    return 2;
  }
  std::optional<troupe::comm::BackgroundWaits> background_waits;  // the main thread's waits sleep at once
  if (background) background_waits.emplace();
  size_t large = 0;
  if (scale > 0) large = static_cast<size_t>(std::llround(1000003 * scale)) | 1;  // odd
  if (check == "all") return check_all(**world, large);
  if (check == "all_to_all") return check_all_to_all(**world, scale);
  if (check == "a2a-mismatch") return check_a2a_mismatch(**world);
  if (check == "kill-target" || check == "kill-target-idle") {
    return check_kill(**world, kill_rank >= 0 ? kill_rank : world_size - 1,
                      check == "kill-target-idle", soak_op);
  }
  if (check == "mismatch") return check_mismatch(**world);
  if (check == "bench") return bench(**world, bench_max, iters);
  if (check == "chaos") return chaos(**world, seconds);
  if (check == "ucx-fatal") return ucx_fatal(**world);
  if (check == "soak") return soak(**world, soak_op, bench_max, iters);
  usage(("unknown --check " + check).c_str());
}
