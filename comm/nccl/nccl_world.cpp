// The nccl backend (see nccl_world.hpp for the contract).
#include "comm/nccl/nccl_world.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/device_memory.hpp"
#include "troupe/check.hpp"

namespace troupe::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string(ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') s += std::string(" (NCCL: ") + last + ")";
  return s;
}

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

std::string seconds_text(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// Makes `device` current for a scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      if (cudaSetDevice(device) != cudaSuccess) previous_ = -1;
    } else {
      previous_ = -1;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Polling pause: yield for the first ~50 us (collectives of small buffers finish in microseconds),
// then sleep, doubling up to 1 ms.
class Backoff {
 public:
  void pause() {
    if (Clock::now() - start_ < std::chrono::microseconds(50)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{20};
};

// A non-blocking communicator may answer ncclInProgress: the call goes on in the background and the
// communicator's state says when it is done. Returns the final state, or ncclInProgress on timeout.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline) {
  Backoff backoff;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) return ncclInProgress;
    backoff.pause();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    r = q != ncclSuccess ? q : state;
  }
  return r;
}

std::optional<ncclDataType_t> reduce_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::u8:
      return ncclUint8;
    case DType::u16:
      return std::nullopt;
  }
  return std::nullopt;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : ncclMax;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

std::string members_text(const std::vector<int>& members) {
  std::string s = "[";
  for (size_t i = 0; i < members.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(members[i]);
  }
  s += ']';
  return s;
}

// Joins an NCCL communicator (non-blocking init, polled until done or `timeout`). On failure the
// half-made communicator is aborted and the error says why.
Result<ncclComm_t> init_comm(int nranks, const ncclUniqueId& id, int rank,
                             std::chrono::milliseconds timeout, const std::string& what) {
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (comm != nullptr) r = settle(comm, r, Clock::now() + timeout);
  if (r == ncclSuccess) return comm;
  std::string cause =
      r == ncclInProgress
          ? "not every rank joined within " + seconds_text(timeout) +
                ": a rank died, was never started, or created its communicators in a different "
                "order"
          : nccl_text(r, comm);
  if (comm != nullptr) (void)ncclCommAbort(comm);
  return Status::error(
      "nccl: creating " + what + " (rank " + std::to_string(rank) + " of " +
      std::to_string(nranks) + ") failed: " + cause +
      ". Check that every rank runs, each on its own GPU; NCCL_DEBUG=WARN shows NCCL's view.");
}

// One NCCL communicator with its stream, shared by the Communicator and its Works (a Work may
// outlive its communicator). Every NCCL call on `comm` happens under `mu`; once aborted, `comm` is
// gone.
struct CommCore {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0;
  int size = 1;
  std::string label;  // "group [0,2] (rank 1 of 2, world rank 2, device 1)"
  NcclOptions options;
  int32_t* scratch = nullptr;  // device: the barrier's element
  cudaEvent_t ordered = nullptr;  // launch(): the caller's stream's point the operation waits for

  std::mutex mu;
  bool aborted = false;
  std::string failure;

  CommCore() = default;
  CommCore(const CommCore&) = delete;
  CommCore& operator=(const CommCore&) = delete;

  // Aborts the communicator (stopping its kernels) and records why; returns the error. Needs `mu`.
  Status fail_locked(const std::string& what, const std::string& cause) {
    if (!aborted) {
      failure =
          "nccl " + what + " on " + label + " failed: " + cause +
          ". The communicator is aborted; every later operation on it fails. Look for the first "
          "failure in the other ranks' logs (NCCL_DEBUG=WARN prints NCCL's own report).";
      aborted = true;
      DeviceGuard guard(device);
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    return Status::error(failure);
  }

  // The communicator's asynchronous error, if any (ncclRemoteError when a peer exited). Needs `mu`.
  std::optional<std::string> async_error_locked() {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    const ncclResult_t r = q != ncclSuccess ? q : state;
    if (r == ncclSuccess || r == ncclInProgress) return std::nullopt;
    return nccl_text(r, comm);
  }

  ~CommCore() {
    DeviceGuard guard(device);
    if (!aborted && comm != nullptr) {
      // Finalize flushes what is queued; a peer that is gone would make it wait forever, so it is
      // timed and the communicator aborted past the deadline.
      ncclResult_t r = ncclCommFinalize(comm);
      r = settle(comm, r, Clock::now() + options.destroy_timeout);
      if (r == ncclSuccess) {
        (void)ncclCommDestroy(comm);
      } else {
        (void)ncclCommAbort(comm);
      }
    }
    if (scratch != nullptr) (void)cudaFree(scratch);
    if (ordered != nullptr) (void)cudaEventDestroy(ordered);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
};

// Creates the stream and scratch of a joined communicator; takes ownership of `comm` either way.
Result<std::shared_ptr<CommCore>> make_core(ncclComm_t comm, int device, int rank, int size,
                                            std::string label, const NcclOptions& options) {
  auto core = std::make_shared<CommCore>();
  core->comm = comm;
  core->device = device;
  core->rank = rank;
  core->size = size;
  core->label = std::move(label);
  core->options = options;
  DeviceGuard guard(device);
  cudaError_t e = cudaStreamCreateWithFlags(&core->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&core->scratch), sizeof(int32_t));
  if (e == cudaSuccess) e = cudaMemsetAsync(core->scratch, 0, sizeof(int32_t), core->stream);
  if (e != cudaSuccess) {
    return Status::error("nccl: setting up " + core->label + " failed: " + cuda_text(e) +
                         ". Is the device out of memory or in an error state?");
  }
  return core;
}

// An operation in flight: a CUDA event recorded on the communicator's stream after it.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<CommCore> core, cudaEvent_t event, std::string what)
      : core_(std::move(core)),
        event_(event),
        what_(std::move(what)),
        deadline_(Clock::now() + core_->options.op_timeout) {}
  ~NcclWork() override {
    DeviceGuard guard(core_->device);
    (void)cudaEventDestroy(event_);
  }

  bool do_test() override {
    if (result_) return true;
    poll();
    return result_.has_value();
  }

  Status do_wait() override {
    Backoff backoff;
    while (!do_test()) backoff.pause();
    return *result_;
  }

 private:
  void poll() {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->aborted) {
      result_ = Status::error(core_->failure);
      return;
    }
    const cudaError_t e = cudaEventQuery(event_);
    // An event also completes when NCCL stopped its kernel early on an error, so the communicator's
    // state is checked either way before the data counts as valid.
    if (auto error = core_->async_error_locked()) {
      result_ = core_->fail_locked(what_, *error);
    } else if (e == cudaSuccess) {
      result_ = Status::ok();
    } else if (e != cudaErrorNotReady) {
      result_ = core_->fail_locked(
          what_, "CUDA reported " + cuda_text(e) +
                     " (a kernel on this device faulted; the CUDA context is unusable)");
    } else if (Clock::now() > deadline_) {
      result_ = core_->fail_locked(what_, "not complete within " +
                                              seconds_text(core_->options.op_timeout) +
                                              " (NcclOptions::op_timeout): a peer died or hangs, "
                                              "or the members called operations in "
                                              "different orders or with different counts");
    }
  }

  std::shared_ptr<CommCore> core_;
  cudaEvent_t event_;
  std::string what_;
  Clock::time_point deadline_;
  std::optional<Status> result_;
};

size_t byte_count(size_t count, DType dtype) {
  return count * dtype_size(dtype);
}

class NcclComm final : public NcclCommunicator {
 public:
  explicit NcclComm(std::shared_ptr<CommCore> core) : core_(std::move(core)) {}

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  std::string backend() const override { return "nccl"; }
  int device() const override { return core_->device; }
  cudaStream_t stream() const override { return core_->stream; }

  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const std::string what = describe("all_reduce", count, dtype);
    const auto type = reduce_type(dtype);
    if (!type) return unsupported(what, dtype);
    if (count == 0) return completed_work();
    return launch(what, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(buf, buf, count, *type, nccl_op(op), comm, s);
    });
  }

  WorkPtr reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                           DType dtype, ReduceOp op) override {
    TROUPE_CHECK(counts.size() == static_cast<size_t>(size()),
                 "reduce_scatter_v takes one count per rank");
    const std::string what = describe("reduce_scatter", total(counts), dtype);
    const auto type = reduce_type(dtype);
    if (!type) return unsupported(what, dtype);
    if (total(counts) == 0) return completed_work();
    if (equal(counts)) {
      return launch(what, [&](ncclComm_t comm, cudaStream_t s) {
        return ncclReduceScatter(send, recv, counts[0], *type, nccl_op(op), comm, s);
      });
    }
    return launch(what, [&](ncclComm_t comm, cudaStream_t s) {
      return grouped([&] {
        size_t offset = 0;
        for (int r = 0; r < size(); ++r) {
          if (counts[r] > 0) {
            const char* block = static_cast<const char*>(send) + byte_count(offset, dtype);
            const ncclResult_t res = ncclReduce(block, r == rank() ? recv : nullptr, counts[r],
                                                *type, nccl_op(op), r, comm, s);
            if (res != ncclSuccess && res != ncclInProgress) return res;
          }
          offset += counts[r];
        }
        return ncclSuccess;
      });
    });
  }

  WorkPtr all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                       DType dtype) override {
    TROUPE_CHECK(counts.size() == static_cast<size_t>(size()),
                 "all_gather_v takes one count per rank");
    const std::string what = describe("all_gather", total(counts), dtype);
    if (total(counts) == 0) return completed_work();
    if (equal(counts)) {
      return launch(what, [&](ncclComm_t comm, cudaStream_t s) {
        return ncclAllGather(send, recv, byte_count(counts[0], dtype), ncclUint8, comm, s);
      });
    }
    return launch(what, [&](ncclComm_t comm, cudaStream_t s) {
      return grouped([&] {
        size_t offset = 0;
        for (int r = 0; r < size(); ++r) {
          if (counts[r] > 0) {
            char* block = static_cast<char*>(recv) + byte_count(offset, dtype);
            const ncclResult_t res =
                ncclBroadcast(r == rank() ? send : block, block, byte_count(counts[r], dtype),
                              ncclUint8, r, comm, s);
            if (res != ncclSuccess && res != ncclInProgress) return res;
          }
          offset += counts[r];
        }
        return ncclSuccess;
      });
    });
  }

  WorkPtr all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                       std::span<const size_t> recv_counts, DType dtype) override {
    TROUPE_CHECK(send_counts.size() == static_cast<size_t>(size()) &&
                     recv_counts.size() == static_cast<size_t>(size()),
                 "all_to_all_v takes one send count and one recv count per rank");
    const size_t sent = total(send_counts), received = total(recv_counts);
    if (sent == 0 && received == 0) return completed_work();
    // launch() runs the body before it returns: the spans are still the caller's.
    return launch(describe("all_to_all", sent, dtype), [&](ncclComm_t comm, cudaStream_t s) {
      return grouped([&] {
        // Every pair's blocks, this rank's own included (NCCL copies a send to self locally);
        // empty blocks are skipped on both sides alike when the counts agree.
        size_t send_offset = 0, recv_offset = 0;
        for (int r = 0; r < size(); ++r) {
          const size_t out = byte_count(send_counts[r], dtype);
          const size_t in = byte_count(recv_counts[r], dtype);
          if (out > 0) {
            const ncclResult_t res =
                ncclSend(static_cast<const char*>(send) + byte_count(send_offset, dtype), out,
                         ncclUint8, r, comm, s);
            if (res != ncclSuccess && res != ncclInProgress) return res;
          }
          if (in > 0) {
            const ncclResult_t res =
                ncclRecv(static_cast<char*>(recv) + byte_count(recv_offset, dtype), in, ncclUint8,
                         r, comm, s);
            if (res != ncclSuccess && res != ncclInProgress) return res;
          }
          send_offset += send_counts[r];
          recv_offset += recv_counts[r];
        }
        return ncclSuccess;
      });
    });
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    TROUPE_CHECK(root >= 0 && root < size(), "broadcast root must be a rank of the group");
    if (count == 0) return completed_work();
    return launch(describe("broadcast", count, dtype), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(buf, buf, byte_count(count, dtype), ncclUint8, root, comm, s);
    });
  }

  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    const P2POp op{true, const_cast<void*>(buf), count, dtype, peer};
    return p2p(std::span<const P2POp>(&op, 1), describe_p2p("send to", count, dtype, peer, tag));
  }

  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    const P2POp op{false, buf, count, dtype, peer};
    return p2p(std::span<const P2POp>(&op, 1), describe_p2p("recv from", count, dtype, peer, tag));
  }

  WorkPtr batch_p2p(std::span<const P2POp> ops) override {
    return p2p(ops, "batch of " + std::to_string(ops.size()) + " sends/recvs");
  }

  WorkPtr barrier() override {
    return launch("barrier", [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(core_->scratch, core_->scratch, 1, ncclInt32, ncclSum, comm, s);
    });
  }

 private:
  using Body = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

  // Enqueues `body` on the stream and records the Work's event after it.
  WorkPtr launch(const std::string& what, const Body& body) {
    CommCore& c = *core_;
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.aborted) return completed_work(Status::error(c.failure));
    DeviceGuard guard(c.device);
    // After the work the calling thread queued on its current stream (DeviceScope,
    // kernels/device_memory.hpp: a rank engine's entry points set the rank's), so the buffers its
    // kernels just wrote are complete when NCCL reads them, without the host waiting.
    if (const DevicePlacement at = current_placement(); at.stream != 0 && at.device == c.device) {
      cudaError_t e = c.ordered != nullptr ? cudaSuccess : cudaEventCreateWithFlags(&c.ordered, cudaEventDisableTiming);
      if (e == cudaSuccess) e = cudaEventRecord(c.ordered, reinterpret_cast<cudaStream_t>(at.stream));
      if (e == cudaSuccess) e = cudaStreamWaitEvent(c.stream, c.ordered, 0);
      if (e != cudaSuccess) return completed_work(c.fail_locked(what, "ordering it after the caller's stream: " + cuda_text(e)));
    }
    ncclResult_t r = body(c.comm, c.stream);
    r = settle(c.comm, r, Clock::now() + c.options.op_timeout);
    if (r == ncclInProgress) {
      return completed_work(c.fail_locked(
          what, "NCCL did not finish enqueueing within " + seconds_text(c.options.op_timeout)));
    }
    if (r != ncclSuccess) return completed_work(c.fail_locked(what, nccl_text(r, c.comm)));
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(event, c.stream);
    if (e != cudaSuccess) {
      if (event != nullptr) (void)cudaEventDestroy(event);
      return completed_work(c.fail_locked(what, "recording its completion event: " + cuda_text(e)));
    }
    return std::make_shared<NcclWork>(core_, event, what);
  }

  // Runs `calls` between ncclGroupStart and ncclGroupEnd (the end is reached even after an error,
  // to close the group).
  static ncclResult_t grouped(const std::function<ncclResult_t()>& calls) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    const ncclResult_t inner = calls();
    const ncclResult_t end = ncclGroupEnd();
    return inner != ncclSuccess && inner != ncclInProgress ? inner : end;
  }

  WorkPtr p2p(std::span<const P2POp> ops, const std::string& what) {
    size_t bytes = 0;
    for (const P2POp& op : ops) {
      TROUPE_CHECK(op.peer >= 0 && op.peer < size(), "send/recv peer must be a rank of the group");
      TROUPE_CHECK(op.peer != rank(),
                   "the nccl backend cannot send to or receive from its own rank");
      bytes += byte_count(op.count, op.dtype);
    }
    if (bytes == 0) return completed_work();
    return launch(what, [&](ncclComm_t comm, cudaStream_t s) {
      return grouped([&] {
        for (const P2POp& op : ops) {
          const size_t n = byte_count(op.count, op.dtype);
          if (n == 0) continue;
          const ncclResult_t res = op.is_send ? ncclSend(op.buf, n, ncclUint8, op.peer, comm, s)
                                              : ncclRecv(op.buf, n, ncclUint8, op.peer, comm, s);
          if (res != ncclSuccess && res != ncclInProgress) return res;
        }
        return ncclSuccess;
      });
    });
  }

  WorkPtr unsupported(const std::string& what, DType dtype) const {
    return completed_work(
        Status::error("nccl " + what + ": " + dtype_name(dtype) +
                      " cannot be reduced; use f32, f64, i32, i64, bf16, f16 or u8"));
  }

  static std::string describe(const char* op, size_t count, DType dtype) {
    return std::string(op) + " of " + std::to_string(count) + " " + dtype_name(dtype);
  }
  static std::string describe_p2p(const char* op, size_t count, DType dtype, int peer,
                                  uint64_t tag) {
    return describe(op, count, dtype) + " " + std::to_string(peer) + " (tag " +
           std::to_string(tag) + ")";
  }
  static size_t total(std::span<const size_t> counts) {
    size_t t = 0;
    for (size_t c : counts) t += c;
    return t;
  }
  static bool equal(std::span<const size_t> counts) {
    return std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
  }

  std::shared_ptr<CommCore> core_;
};

// What the first member of a group sends the others over the world communicator.
struct GroupId {
  ncclUniqueId id;
  uint64_t members_hash;
};

uint64_t hash_members(const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the member list
  for (int m : members) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint64_t>((static_cast<uint32_t>(m) >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  }
  return h ^ members.size();
}

class NcclWorld final : public CommWorld {
 public:
  NcclWorld(std::shared_ptr<CommCore> root, GroupId* id_buffer)
      : root_(std::move(root)), id_buffer_(id_buffer) {}
  ~NcclWorld() override {
    DeviceGuard guard(root_->device);
    (void)cudaFree(id_buffer_);
  }

  int rank() const override { return root_->rank; }
  int size() const override { return root_->size; }
  std::string backend() const override { return "nccl"; }

  Result<std::unique_ptr<Communicator>> group(const std::vector<int>& members) override {
    const std::string name = "group " + members_text(members);
    std::set<int> seen;
    int position = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] < 0 || members[i] >= size() || !seen.insert(members[i]).second) {
        return Status::error("nccl: " + name + " is not a list of distinct world ranks in [0, " +
                             std::to_string(size()) + "); pass each member once");
      }
      if (members[i] == rank()) position = static_cast<int>(i);
    }
    if (position < 0) {
      return Status::error("nccl: world rank " + std::to_string(rank()) + " called group() for " +
                           name + ", which it is not in; only members create a group");
    }
    std::lock_guard<std::mutex> serial(group_mu_);
    auto id = exchange_id(members, position, name);
    if (!id) return id.status();
    auto comm = init_comm(static_cast<int>(members.size()), *id, position,
                          root_->options.init_timeout, name);
    if (!comm) return comm.status();
    const std::string label = name + " (rank " + std::to_string(position) + " of " +
                              std::to_string(members.size()) + ", world rank " +
                              std::to_string(rank()) + ", device " + std::to_string(root_->device) +
                              ")";
    auto core = make_core(*comm, root_->device, position, static_cast<int>(members.size()), label,
                          root_->options);
    if (!core) return core.status();
    return std::unique_ptr<Communicator>(std::make_unique<NcclComm>(std::move(core).value()));
  }

 private:
  // The first member makes the group's id and sends it to the others (point-to-point on the world
  // communicator, so non-members take no part).
  Result<ncclUniqueId> exchange_id(const std::vector<int>& members, int position,
                                   const std::string& name) {
    CommCore& w = *root_;
    const uint64_t hash = hash_members(members);
    const std::string what = "id exchange for " + name;
    GroupId msg{};
    std::lock_guard<std::mutex> lock(w.mu);
    if (w.aborted) return Status::error(w.failure);
    DeviceGuard guard(w.device);
    if (position == 0) {
      const ncclResult_t r = ncclGetUniqueId(&msg.id);
      if (r != ncclSuccess)
        return Status::error("nccl: " + what + ": ncclGetUniqueId: " + ncclGetErrorString(r));
      msg.members_hash = hash;
      if (members.size() == 1) return msg.id;
      // On the world stream, so the send below is ordered after the copy (a plain cudaMemcpy from
      // pageable memory may return before its DMA lands, and that stream does not wait for it).
      cudaError_t e =
          cudaMemcpyAsync(id_buffer_, &msg, sizeof msg, cudaMemcpyHostToDevice, w.stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(w.stream);
      if (e != cudaSuccess) return Status::error("nccl: " + what + ": " + cuda_text(e));
    }
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) {
      if (position == 0) {
        for (size_t i = 1; i < members.size() && r == ncclSuccess; ++i) {
          r = ncclSend(id_buffer_, sizeof(GroupId), ncclUint8, members[i], w.comm, w.stream);
          if (r == ncclInProgress) r = ncclSuccess;
        }
      } else {
        r = ncclRecv(id_buffer_, sizeof(GroupId), ncclUint8, members[0], w.comm, w.stream);
        if (r == ncclInProgress) r = ncclSuccess;
      }
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess) r = end;
    }
    const Clock::time_point deadline = Clock::now() + w.options.init_timeout;
    r = settle(w.comm, r, deadline);
    if (r != ncclSuccess && r != ncclInProgress) return w.fail_locked(what, nccl_text(r, w.comm));
    // Wait for the transfer itself, watching for a peer failure and the deadline.
    Backoff backoff;
    for (;;) {
      if (r == ncclInProgress || Clock::now() > deadline) {
        return w.fail_locked(
            what, "world rank " + std::to_string(members[0]) +
                      " and the other members did not "
                      "all reach group() within " +
                      seconds_text(w.options.init_timeout) +
                      ": a member died, or the ranks create their groups in different orders");
      }
      if (auto error = w.async_error_locked()) return w.fail_locked(what, *error);
      const cudaError_t e = cudaStreamQuery(w.stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return w.fail_locked(what, cuda_text(e));
      backoff.pause();
    }
    if (position != 0) {
      const cudaError_t e = cudaMemcpy(&msg, id_buffer_, sizeof msg, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) return Status::error("nccl: " + what + ": " + cuda_text(e));
      if (msg.members_hash != hash) {
        return Status::error(
            "nccl: " + name + ": world rank " + std::to_string(members[0]) +
            " created a group with a different member list; every member must pass the same "
            "list in the same order");
      }
    }
    return msg.id;
  }

  std::shared_ptr<CommCore> root_;  // the world communicator: group set-up only
  GroupId* id_buffer_;              // device
  std::mutex group_mu_;
};

}  // namespace

Result<std::unique_ptr<CommWorld>> create_nccl_world(Bootstrap& bootstrap, int device,
                                                     const NcclOptions& options) {
  const int rank = bootstrap.rank(), size = bootstrap.world_size();
  const std::string where = "nccl: rank " + std::to_string(rank) + " of " + std::to_string(size);
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return Status::error(
        where + ": no usable CUDA device (" +
        (e != cudaSuccess ? cuda_text(e) : std::string("0 devices")) +
        "); the nccl backend needs one GPU per rank: check the driver and CUDA_VISIBLE_DEVICES, or "
        "use --backend local or ucx");
  }
  if (device < 0 || device >= devices) {
    return Status::error(where + ": device " + std::to_string(device) +
                         " does not exist (this process sees " + std::to_string(devices) +
                         "); give each rank a device in [0, " + std::to_string(devices) + ")");
  }
  // The world's device becomes the calling thread's current device, as a rank's thread expects.
  e = cudaSetDevice(device);
  if (e != cudaSuccess)
    return Status::error(where + ": cudaSetDevice(" + std::to_string(device) +
                         "): " + cuda_text(e));

  std::string mine;
  if (rank == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return Status::error(where + ": ncclGetUniqueId failed: " + ncclGetErrorString(r) +
                           " (NCCL found no usable network interface? set NCCL_SOCKET_IFNAME)");
    }
    mine.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  auto blobs = bootstrap.all_gather(options.key, mine);
  if (!blobs) return blobs.status().with_context(where + ": sharing the NCCL id: ");
  const std::string& blob = blobs.value().at(0);
  if (blob.size() != sizeof(ncclUniqueId)) {
    return Status::error(where + ": rank 0's NCCL id has " + std::to_string(blob.size()) +
                         " bytes, not " + std::to_string(sizeof(ncclUniqueId)) +
                         "; do all ranks run the same troupe and NCCL?");
  }
  ncclUniqueId id;
  std::memcpy(&id, blob.data(), sizeof id);

  auto comm = init_comm(size, id, rank, options.init_timeout, "the world communicator");
  if (!comm) return comm.status();
  const std::string label = "the world (rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + ", device " + std::to_string(device) + ")";
  auto core = make_core(*comm, device, rank, size, label, options);
  if (!core) return core.status();
  GroupId* id_buffer = nullptr;
  e = cudaMalloc(reinterpret_cast<void**>(&id_buffer), sizeof(GroupId));
  if (e != cudaSuccess) return Status::error(where + ": cudaMalloc: " + cuda_text(e));
  return std::unique_ptr<CommWorld>(
      std::make_unique<NcclWorld>(std::move(core).value(), id_buffer));
}

}  // namespace troupe::comm
