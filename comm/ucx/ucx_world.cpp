// UcxWorld and its communicators: argument checks on the caller's thread, then an Op for the
// engine.
#include "comm/ucx/ucx_world.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "comm/ucx/ucx_collectives.hpp"
#include "comm/ucx/ucx_engine.hpp"
#include "comm/ucx/ucx_reduce.hpp"

namespace troupe::comm {

namespace {

using ucx::Engine;
using ucx::GroupPtr;

constexpr uint64_t kUserTagLimit = 1ull << 56;

class UcxCommunicator final : public Communicator {
 public:
  UcxCommunicator(std::shared_ptr<Engine> engine, GroupPtr group)
      : engine_(std::move(engine)), group_(std::move(group)) {
    describe_ = "group of " + std::to_string(group_->size()) + " [";
    for (size_t i = 0; i < group_->members.size() && i < 8; ++i) {
      if (i != 0) describe_ += ',';
      describe_ += std::to_string(group_->members[i]);
    }
    describe_ += group_->members.size() > 8 ? ",...]" : "]";
  }
  ~UcxCommunicator() override { engine_->release_group(*group_); }

  int rank() const override { return group_->rank; }
  int size() const override { return group_->size(); }
  std::string backend() const override { return "ucx"; }

  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    if (!ucx::reducible(dtype)) return completed_work(unsupported("all_reduce", dtype));
    if (count == 0 || size() == 1) return completed_work();
    const uint64_t seq = seq_++;
    return engine_->submit(ucx::make_all_reduce(*engine_, group_, seq, name("all_reduce", seq), buf,
                                                count, dtype, op));
  }

  WorkPtr reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts,
                           DType dtype, ReduceOp op) override {
    if (!ucx::reducible(dtype)) return completed_work(unsupported("reduce_scatter", dtype));
    if (Status s = check_counts("reduce_scatter", counts); !s.is_ok()) return completed_work(s);
    if (total(counts) == 0) return completed_work();
    if (size() == 1) {
      if (counts[0] != 0 && send != recv) std::memmove(recv, send, counts[0] * dtype_size(dtype));
      return completed_work();
    }
    const uint64_t seq = seq_++;
    return engine_->submit(ucx::make_reduce_scatter(*engine_, group_, seq,
                                                    name("reduce_scatter", seq), send, recv,
                                                    {counts.begin(), counts.end()}, dtype, op));
  }

  WorkPtr all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                       DType dtype) override {
    if (Status s = check_counts("all_gather", counts); !s.is_ok()) return completed_work(s);
    if (total(counts) == 0) return completed_work();
    if (size() == 1) {
      if (counts[0] != 0 && send != recv) std::memmove(recv, send, counts[0] * dtype_size(dtype));
      return completed_work();
    }
    const uint64_t seq = seq_++;
    return engine_->submit(ucx::make_all_gather(*engine_, group_, seq, name("all_gather", seq), send,
                                                recv, {counts.begin(), counts.end()}, dtype));
  }

  WorkPtr all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                       std::span<const size_t> recv_counts, DType dtype) override {
    if (Status s = check_counts("all_to_all send", send_counts); !s.is_ok())
      return completed_work(s);
    if (Status s = check_counts("all_to_all recv", recv_counts); !s.is_ok())
      return completed_work(s);
    const size_t esz = dtype_size(dtype);
    const size_t send_bytes = total(send_counts) * esz, recv_bytes = total(recv_counts) * esz;
    const auto* s = static_cast<const char*>(send);
    const auto* r = static_cast<const char*>(recv);
    if (send_bytes > 0 && recv_bytes > 0 && s < r + recv_bytes && r < s + send_bytes) {
      return completed_work(Status::error(
          "ucx all_to_all: send and recv overlap; all_to_all needs two separate buffers"));
    }
    if (size() == 1) {
      if (send_counts[0] != recv_counts[0]) {
        return completed_work(Status::error(
            "ucx all_to_all: this rank sends itself " + std::to_string(send_counts[0]) +
            " elements but its recv_counts[0] is " + std::to_string(recv_counts[0]) +
            "; recv_counts[p] must equal what group rank p passes as send_counts[rank()]"));
      }
      if (send_bytes != 0) std::memcpy(recv, send, send_bytes);
      return completed_work();
    }
    // No shortcut for zero counts: the peers' counts decide whether this rank takes part.
    const uint64_t seq = seq_++;
    return engine_->submit(ucx::make_all_to_all(*engine_, group_, seq, name("all_to_all", seq),
                                                send, {send_counts.begin(), send_counts.end()},
                                                recv, {recv_counts.begin(), recv_counts.end()},
                                                esz));
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size()) return completed_work(bad_rank("broadcast root", root));
    if (count == 0 || size() == 1) return completed_work();
    const uint64_t seq = seq_++;
    return engine_->submit(ucx::make_broadcast(*engine_, group_, seq, name("broadcast", seq), buf,
                                               count * dtype_size(dtype), root));
  }

  WorkPtr send(const void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    if (peer < 0 || peer >= size()) return completed_work(bad_rank("send peer", peer));
    if (tag >= kUserTagLimit) return completed_work(bad_tag(tag));
    return engine_->submit(
        ucx::make_p2p_send(*engine_, group_, seq_, buf, count * dtype_size(dtype), peer, tag));
  }

  WorkPtr recv(void* buf, size_t count, DType dtype, int peer, uint64_t tag) override {
    if (peer < 0 || peer >= size()) return completed_work(bad_rank("recv peer", peer));
    if (tag >= kUserTagLimit) return completed_work(bad_tag(tag));
    return engine_->submit(
        ucx::make_p2p_recv(*engine_, group_, seq_, buf, count * dtype_size(dtype), peer, tag));
  }

  WorkPtr barrier() override {
    if (size() == 1) return completed_work();
    const uint64_t seq = seq_++;
    return engine_->submit(ucx::make_barrier(*engine_, group_, seq, name("barrier", seq)));
  }

 private:
  std::string name(const char* op, uint64_t seq) const {
    return std::string("ucx ") + op + " (rank " + std::to_string(engine_->rank()) + ", " +
           describe_ + ", call #" + std::to_string(seq) + ")";
  }
  static size_t total(std::span<const size_t> counts) {
    size_t t = 0;
    for (size_t c : counts) t += c;
    return t;
  }
  Status check_counts(const char* op, std::span<const size_t> counts) const {
    if (counts.size() == static_cast<size_t>(size())) return Status::ok();
    return Status::error(std::string("ucx ") + op + ": got " + std::to_string(counts.size()) +
                         " counts for a group of " + std::to_string(size()) +
                         "; pass one count per rank");
  }
  static Status unsupported(const char* op, DType dtype) {
    return Status::error(std::string("ucx ") + op + " cannot reduce " + dtype_name(dtype) +
                         "; reduce f32, f64, bf16, f16, i32 or i64 (convert first)");
  }
  Status bad_rank(const char* what, int r) const {
    return Status::error(std::string("ucx ") + what + " " + std::to_string(r) +
                         " is outside the group [0, " + std::to_string(size()) + ")");
  }
  static Status bad_tag(uint64_t tag) {
    return Status::error("ucx send/recv: tag " + std::to_string(tag) +
                         " is reserved (tags must be below 2^56); use a smaller tag");
  }

  std::shared_ptr<Engine> engine_;
  GroupPtr group_;
  std::string describe_;
  uint64_t seq_ = 0;
};

class UcxWorld final : public CommWorld {
 public:
  explicit UcxWorld(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  int rank() const override { return engine_->rank(); }
  int size() const override { return engine_->size(); }
  std::string backend() const override { return "ucx"; }
  void abort(const std::string& why) override { engine_->request_abort(why); }
  Result<std::unique_ptr<Communicator>> group(const std::vector<int>& members) override {
    auto info = engine_->make_group(members);
    if (!info.is_ok()) return info.status();
    return std::unique_ptr<Communicator>(new UcxCommunicator(engine_, std::move(info).value()));
  }

 private:
  std::shared_ptr<Engine> engine_;
};

// Reads a positive integer from the environment into `value`; a malformed value is an error.
Status env_size(const char* name, size_t min, size_t max, size_t& value) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return Status::ok();
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end != nullptr) {
    if (*end == 'k' || *end == 'K') {
      v <<= 10;
      ++end;
    } else if (*end == 'm' || *end == 'M') {
      v <<= 20;
      ++end;
    } else if (*end == 'g' || *end == 'G') {
      v <<= 30;
      ++end;
    }
  }
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
    return Status::error(std::string(name) + "='" + s + "' is not a number in [" +
                         std::to_string(min) + ", " + std::to_string(max) +
                         "] (a K, M or G suffix is allowed); fix or unset it");
  }
  value = static_cast<size_t>(v);
  return Status::ok();
}

// UCX reads UCX_NET_DEVICES when a context is created. A value the user set is left alone; one
// troupe set (an earlier world of this process) is replaced.
std::mutex net_devices_mu;
std::string net_devices_ours;  // what apply_net_devices last set

void apply_net_devices(const std::string& devices) {
  std::lock_guard<std::mutex> lock(net_devices_mu);
  const char* now = std::getenv("UCX_NET_DEVICES");
  if (now != nullptr && *now != '\0' && net_devices_ours != now) return;
  ::setenv("UCX_NET_DEVICES", devices.c_str(), 1);
  net_devices_ours = devices;
}

// UCX_NET_DEVICES holds what an earlier world of this process set (the network plan's devices,
// which the plan no longer reports once they are in the environment).
bool net_devices_set_by_us() {
  std::lock_guard<std::mutex> lock(net_devices_mu);
  const char* now = std::getenv("UCX_NET_DEVICES");
  return !net_devices_ours.empty() && now != nullptr && net_devices_ours == now;
}

}  // namespace

Result<std::unique_ptr<CommWorld>> create_ucx_world(Bootstrap& bootstrap,
                                                    const UcxOptions& options) {
  UcxOptions o = options;
  size_t in_flight = static_cast<size_t>(std::max(o.chunks_in_flight, 0));
  size_t direct_max = static_cast<size_t>(std::max(o.direct_max_ranks, 0));
  size_t spin_us = static_cast<size_t>(std::max(o.spin_us, 0));
  TROUPE_RETURN_IF_ERROR(env_size("TROUPE_UCX_RING_THRESHOLD", 0,
                                  std::numeric_limits<size_t>::max() >> 1, o.ring_threshold));
  TROUPE_RETURN_IF_ERROR(env_size("TROUPE_UCX_CHUNK_BYTES", 4096, size_t{1} << 30, o.chunk_bytes));
  TROUPE_RETURN_IF_ERROR(env_size("TROUPE_UCX_CHUNKS_IN_FLIGHT", 1, 1024, in_flight));
  TROUPE_RETURN_IF_ERROR(env_size("TROUPE_UCX_DIRECT_MAX_RANKS", 0, 2048, direct_max));
  TROUPE_RETURN_IF_ERROR(env_size("TROUPE_UCX_SPIN_US", 0, 1000000, spin_us));
  if (const char* v = std::getenv("TROUPE_UCX_SAME_HOST"); v != nullptr && *v != '\0') {
    const std::string mode(v);
    if (mode != "shm" && mode != "ucx") {
      return Status::error("TROUPE_UCX_SAME_HOST='" + mode +
                           "' must be 'shm' (shared memory, this rank watches " +
                           "same-host peers) or 'ucx' (UCX error handling, TCP loopback)");
    }
    o.same_host_shm = mode == "shm";
  }
  if (const char* v = std::getenv("TROUPE_UCX_SHM"); v != nullptr && *v != '\0') {
    const std::string mode(v);
    if (mode != "on" && mode != "off" && mode != "require") {
      return Status::error("TROUPE_UCX_SHM='" + mode +
                           "' must be 'on' (shared memory for same-host groups where possible), "
                           "'off' (UCX only) or 'require' (fail unless shared memory works)");
    }
    o.shm = mode == "on" ? UcxShm::on : mode == "off" ? UcxShm::off : UcxShm::require;
  }
  TROUPE_RETURN_IF_ERROR(
      env_size("TROUPE_UCX_SHM_SLOT_BYTES", 4096, size_t{64} << 20, o.shm_slot_bytes));
  TROUPE_RETURN_IF_ERROR(env_size("TROUPE_UCX_SHM_BYTES", size_t{2} << 20,
                                  std::numeric_limits<size_t>::max() >> 2, o.shm_bytes));
  if (o.shm_slot_bytes % 4096 != 0 || o.shm_slot_bytes < 4096 ||
      o.shm_slot_bytes > (size_t{64} << 20)) {
    return Status::error("ucx: shm_slot_bytes " + std::to_string(o.shm_slot_bytes) +
                         " must be a multiple of 4096 in [4096, 64 MiB]");
  }
  if (o.shm_bytes < (size_t{2} << 20)) {
    return Status::error("ucx: shm_bytes " + std::to_string(o.shm_bytes) + " must be >= 2 MiB");
  }
  o.chunks_in_flight = static_cast<int>(in_flight);
  o.direct_max_ranks = static_cast<int>(std::min<size_t>(direct_max, 2048));
  o.spin_us = static_cast<int>(spin_us);
  if (o.chunk_bytes < 4096 || o.chunk_bytes > (size_t{1} << 30)) {
    return Status::error("ucx: chunk_bytes " + std::to_string(o.chunk_bytes) +
                         " must lie in [4096, 2^30]");
  }
  if (o.chunks_in_flight < 1 || o.chunks_in_flight > 1024) {
    return Status::error("ucx: chunks_in_flight " + std::to_string(o.chunks_in_flight) +
                         " must lie in [1, 1024]");
  }
  const std::string devices = o.net_devices.empty() ? bootstrap.ucx_net_devices() : o.net_devices;
  // UCX drops a device that is down when the context is created, for good. Once every rank has
  // joined, the path toward rank 0 works (after a restart it may just have come back). A process
  // whose earlier world set the plan's devices (one that rejoins after a failure: the plan then
  // reports none) waits too, as a replacement process beside it does: the barrier is every rank's.
  if (!devices.empty() || net_devices_set_by_us()) {
    const int n = bootstrap.next_use("ucx devices");
    TROUPE_RETURN_IF_ERROR(
        bootstrap.barrier("ucx/devices" + std::to_string(n))
            .with_context("ucx: waiting for every rank before opening " +
                          (devices.empty() ? std::string("its network devices") : devices) + ": "));
    if (!devices.empty()) apply_net_devices(devices);
  }
  auto engine = Engine::create(bootstrap, o);
  if (!engine.is_ok()) return engine.status();
  return std::unique_ptr<CommWorld>(new UcxWorld(std::move(engine).value()));
}

}  // namespace troupe::comm
