// The nccl backend against a serial reference: every collective on integer-valued inputs, copied
// back to the host and compared exactly. Ranks are threads of this process, one GPU each, joined
// through an in-process Bootstrap. With one GPU only the one-rank world runs (NCCL does not support
// two ranks of one communicator on the same device); the multi-rank case needs two GPUs or more.
// Built with the CUDA backend only; skipped at run time where no GPU is usable.
#ifdef TROUPE_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_world.hpp"
#include "tests/comm/all_to_all_reference.hpp"
#include "tests/test_util.hpp"

namespace {

using namespace troupe;
using namespace troupe::comm;

// Ranks are threads: blobs meet in a shared map under a mutex.
class ThreadBootstrap final : public Bootstrap {
 public:
  struct Shared {
    explicit Shared(int n) : size(n) {}
    int size;
    std::mutex mu;
    std::condition_variable cv;
    struct Slot {
      std::vector<std::string> blobs;
      int arrived = 0;
    };
    std::map<std::string, Slot> slots;
  };
  ThreadBootstrap(std::shared_ptr<Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return shared_->size; }

  Result<std::vector<std::string>> all_gather(const std::string& key,
                                              const std::string& mine) override {
    std::unique_lock<std::mutex> lock(shared_->mu);
    auto& slot = shared_->slots[key];
    if (slot.blobs.empty()) slot.blobs.resize(shared_->size);
    slot.blobs[rank_] = mine;
    ++slot.arrived;
    shared_->cv.notify_all();
    const bool all = shared_->cv.wait_for(lock, std::chrono::seconds(60),
                                          [&] { return slot.arrived >= shared_->size; });
    if (!all)
      return Status::error("test bootstrap: not every rank reached '" + key + "' within 60 s");
    return slot.blobs;
  }
  Status barrier(const std::string& key) override {
    auto r = all_gather(key, "");
    return r ? Status::ok() : r.status();
  }

 private:
  std::shared_ptr<Shared> shared_;
  int rank_;
};

int usable_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

NcclOptions test_options() {
  NcclOptions o;
  o.init_timeout = std::chrono::seconds(60);
  o.op_timeout = std::chrono::seconds(60);
  o.destroy_timeout = std::chrono::seconds(10);
  return o;
}

// Failures found by a rank's thread (Catch2 assertions are not thread-safe), checked on the main
// thread.
struct Errors {
  std::mutex mu;
  std::vector<std::string> list;
  void add(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    list.push_back(e);
  }
};

// A device buffer of n elements of T.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return static_cast<T*>(ptr_); }
  void upload(const std::vector<T>& v) {
    if (!v.empty()) cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    // A copy from pageable memory may return before its DMA lands, and the communicator's stream
    // does not wait for the default stream: make the data ready before any operation reads it.
    cudaDeviceSynchronize();
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_ > 0) cudaMemcpy(v.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  size_t n_;
  void* ptr_ = nullptr;
};

// Rank r's element i: small integers, so sums over ranks are exact in every dtype.
template <class T>
T input(int rank, size_t i) {
  return static_cast<T>((rank + 1) * static_cast<int>(i % 5 + 1));
}

template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                  int rank, Errors& errors) {
  if (got.size() != want.size()) {
    errors.add(what + " on rank " + std::to_string(rank) + ": " + std::to_string(got.size()) +
               " elements, want " + std::to_string(want.size()));
    return;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      errors.add(what + " on rank " + std::to_string(rank) + ": element " + std::to_string(i) +
                 " is " + std::to_string(static_cast<double>(got[i])) + ", want " +
                 std::to_string(static_cast<double>(want[i])));
      return;
    }
  }
}

bool ok(const Status& s, const std::string& what, int rank, Errors& errors) {
  if (s.is_ok()) return true;
  errors.add(what + " on rank " + std::to_string(rank) + ": " + s.message());
  return false;
}

template <class T>
void check_all_reduce(Communicator& c, DType dtype, ReduceOp op, size_t count, Errors& errors) {
  const int r = c.rank(), n = c.size();
  std::vector<T> host(count), want(count);
  for (size_t i = 0; i < count; ++i) {
    host[i] = input<T>(r, i);
    want[i] = op == ReduceOp::sum ? T(0) : input<T>(0, i);
    for (int q = 0; q < n; ++q) {
      want[i] =
          op == ReduceOp::sum ? T(want[i] + input<T>(q, i)) : std::max(want[i], input<T>(q, i));
    }
  }
  DeviceArray<T> buf(count);
  buf.upload(host);
  const std::string what =
      std::string("all_reduce ") + reduce_op_name(op) + " " + dtype_name(dtype);
  if (!ok(c.all_reduce(buf.get(), count, dtype, op)->wait(), what, r, errors)) return;
  expect_equal(buf.download(), want, what, r, errors);
}

// reduce_scatter_v and all_gather_v with `counts` (equal or not), f32.
void check_scatter_gather(Communicator& c, const std::vector<size_t>& counts, Errors& errors) {
  const int r = c.rank(), n = c.size();
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<size_t> offset(n + 1, 0);
  for (int q = 0; q < n; ++q) offset[q + 1] = offset[q] + counts[q];
  const std::string tag =
      " counts[0]=" + std::to_string(counts[0]) + " total=" + std::to_string(total);

  // reduce_scatter_v: recv = sum over ranks of their block r.
  std::vector<float> send(total), want(counts[r]);
  for (size_t i = 0; i < total; ++i) send[i] = input<float>(r, i);
  for (size_t j = 0; j < counts[r]; ++j) {
    for (int q = 0; q < n; ++q) want[j] += input<float>(q, offset[r] + j);
  }
  {
    DeviceArray<float> dsend(total), drecv(counts[r]);
    dsend.upload(send);
    if (ok(c.reduce_scatter_v(dsend.get(), drecv.get(), counts, DType::f32, ReduceOp::sum)->wait(),
           "reduce_scatter_v" + tag, r, errors)) {
      expect_equal(drecv.download(), want, "reduce_scatter_v" + tag, r, errors);
    }
  }

  // all_gather_v: rank q contributes input(q, j) for j < counts[q]; then the in-place form.
  std::vector<float> mine(counts[r]), gathered(total);
  for (size_t j = 0; j < counts[r]; ++j) mine[j] = input<float>(r, j);
  for (int q = 0; q < n; ++q) {
    for (size_t j = 0; j < counts[q]; ++j) gathered[offset[q] + j] = input<float>(q, j);
  }
  {
    DeviceArray<float> dsend(counts[r]), drecv(total);
    dsend.upload(mine);
    if (ok(c.all_gather_v(dsend.get(), drecv.get(), counts, DType::f32)->wait(),
           "all_gather_v" + tag, r, errors)) {
      expect_equal(drecv.download(), gathered, "all_gather_v" + tag, r, errors);
    }
    std::vector<float> in_place(total, -1.0f);
    std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<std::ptrdiff_t>(offset[r]));
    drecv.upload(in_place);
    if (ok(c.all_gather_v(drecv.get() + offset[r], drecv.get(), counts, DType::f32)->wait(),
           "all_gather_v in place" + tag, r, errors)) {
      expect_equal(drecv.download(), gathered, "all_gather_v in place" + tag, r, errors);
    }
  }
}

void check_broadcast(Communicator& c, Errors& errors) {
  const int r = c.rank(), n = c.size(), root = n - 1;
  const size_t count = 1001;
  // Movement works on any dtype: u16 bit patterns arrive unchanged.
  std::vector<uint16_t> host(count), want(count);
  for (size_t i = 0; i < count; ++i) {
    host[i] = static_cast<uint16_t>(r * 1000 + i);
    want[i] = static_cast<uint16_t>(root * 1000 + i);
  }
  DeviceArray<uint16_t> buf(count);
  buf.upload(host);
  if (ok(c.broadcast(buf.get(), count, DType::u16, root)->wait(), "broadcast u16", r, errors)) {
    expect_equal(buf.download(), want, "broadcast u16", r, errors);
  }
}

// all_to_all_v against the serial exchange (tests/comm/all_to_all_reference.hpp): random counts
// with zeros and odd sizes in four dtypes (raw bits), all zeros, and the equal-count shorthand.
void check_all_to_all(Communicator& c, Errors& errors) {
  namespace a2a = troupe::test::a2a;
  const int r = c.rank(), n = c.size();
  int salt = 0;
  for (DType dtype : {DType::f32, DType::f64, DType::i32, DType::bf16}) {
    const size_t esz = dtype_size(dtype);
    for (size_t max : {size_t{37}, size_t{70000}, size_t{0}}) {
      const uint64_t seed = 500 + static_cast<uint64_t>(salt++);
      const a2a::Case k = a2a::make_case(a2a::random_counts(n, seed, max), esz, seed);
      const std::string what =
          std::string("all_to_all_v ") + dtype_name(dtype) + " max " + std::to_string(max);
      const std::vector<size_t> sc = a2a::send_counts(k.counts, r),
                                rc = a2a::recv_counts(k.counts, r);
      const a2a::Bytes& mine = k.sends[static_cast<size_t>(r)];
      const a2a::Bytes& want = k.expected[static_cast<size_t>(r)];
      DeviceArray<unsigned char> dsend(mine.size()), drecv(want.size());
      dsend.upload(mine);
      if (!ok(c.all_to_all_v(dsend.get(), sc, drecv.get(), rc, dtype)->wait(), what, r, errors))
        continue;
      const std::string diff = a2a::first_difference(drecv.download(), want, esz);
      if (!diff.empty()) errors.add(what + " on rank " + std::to_string(r) + ": " + diff);
    }
  }
  const a2a::Case eq = a2a::make_case(a2a::equal_counts(n, 1001), 4, 77);
  DeviceArray<unsigned char> dsend(eq.sends[static_cast<size_t>(r)].size()),
      drecv(eq.expected[static_cast<size_t>(r)].size());
  dsend.upload(eq.sends[static_cast<size_t>(r)]);
  if (ok(c.all_to_all(dsend.get(), drecv.get(), 1001, DType::f32)->wait(), "all_to_all", r,
         errors) &&
      drecv.download() != eq.expected[static_cast<size_t>(r)])
    errors.add("all_to_all (equal counts) on rank " + std::to_string(r) + " is wrong");
}

// Pairs (0,1), (2,3), ...: two messages each way, tags in order; the lower rank sends first, so the
// unbatched calls cannot deadlock. Then a ring through batch_p2p, where every rank sends first.
void check_send_recv(NcclCommunicator& c, Errors& errors) {
  const int r = c.rank(), n = c.size();
  const size_t count = 1 << 20;  // 4 MiB: beyond NCCL's buffering
  const auto payload = [&](int from, int k) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = static_cast<float>(from * 100 + k * 10 + static_cast<int>(i % 7));
    return v;
  };
  const int peer = r ^ 1;
  if (peer < n) {
    DeviceArray<float> out0(count), out1(count), in0(count), in1(count);
    out0.upload(payload(r, 0));
    out1.upload(payload(r, 1));
    std::vector<WorkPtr> works;
    if (r < peer) {
      works.push_back(c.send(out0.get(), count, DType::f32, peer, 7));
      works.push_back(c.send(out1.get(), count, DType::f32, peer, 8));
      works.push_back(c.recv(in0.get(), count, DType::f32, peer, 7));
      works.push_back(c.recv(in1.get(), count, DType::f32, peer, 8));
    } else {
      works.push_back(c.recv(in0.get(), count, DType::f32, peer, 7));
      works.push_back(c.recv(in1.get(), count, DType::f32, peer, 8));
      works.push_back(c.send(out0.get(), count, DType::f32, peer, 7));
      works.push_back(c.send(out1.get(), count, DType::f32, peer, 8));
    }
    if (ok(wait_all(works), "send/recv pair", r, errors)) {
      expect_equal(in0.download(), payload(peer, 0), "recv tag 7", r, errors);
      expect_equal(in1.download(), payload(peer, 1), "recv tag 8", r, errors);
    }
  }
  if (n > 1) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    DeviceArray<float> out(count), in(count);
    out.upload(payload(r, 2));
    const P2POp ops[] = {{true, out.get(), count, DType::f32, next},
                         {false, in.get(), count, DType::f32, prev}};
    if (ok(c.batch_p2p(ops)->wait(), "batch_p2p ring", r, errors)) {
      expect_equal(in.download(), payload(prev, 2), "batch_p2p ring", r, errors);
    }
  }
}

// Every operation of one communicator, checked against the serial reference.
void exercise(Communicator& c, Errors& errors) {
  check_all_reduce<float>(c, DType::f32, ReduceOp::sum, 1000, errors);
  check_all_reduce<float>(c, DType::f32, ReduceOp::max, 1000, errors);
  check_all_reduce<double>(c, DType::f64, ReduceOp::sum, 333, errors);
  check_all_reduce<int32_t>(c, DType::i32, ReduceOp::sum, 4099, errors);
  check_all_reduce<int64_t>(c, DType::i64, ReduceOp::max, 17, errors);
  check_all_reduce<float>(c, DType::f32, ReduceOp::sum, size_t{1} << 22, errors);  // 16 MiB
  const int n = c.size();
  check_scatter_gather(c, std::vector<size_t>(n, 257), errors);
  std::vector<size_t> uneven(n);
  for (int q = 0; q < n; ++q)
    uneven[q] = static_cast<size_t>((q * 5 + 3) % 8) * 1000;  // 3000, 0, 5000, 2000..
  check_scatter_gather(c, uneven, errors);
  check_broadcast(c, errors);
  check_all_to_all(c, errors);
  if (auto* nc = dynamic_cast<NcclCommunicator*>(&c)) check_send_recv(*nc, errors);
  ok(c.barrier()->wait(), "barrier", c.rank(), errors);
  if (c.all_reduce(nullptr, 0, DType::f32, ReduceOp::sum)->wait().is_ok() == false) {
    errors.add("an all_reduce of 0 elements failed");
  }
}

void check_no_errors(Errors& errors) {
  for (const auto& e : errors.list) UNSCOPED_INFO(e);
  CHECK(errors.list.empty());
}

}  // namespace

TEST_CASE("nccl: create_nccl_world reports a missing device as an error", "[nccl]") {
  // Runs everywhere (no GPU needed): a device index past the last one, or no device at all, is a
  // Status naming the problem, not a crash, and the bootstrap is not used.
  auto shared = std::make_shared<ThreadBootstrap::Shared>(1);
  ThreadBootstrap bootstrap(shared, 0);
  auto world = create_nccl_world(bootstrap, 1000, test_options());
  REQUIRE_FALSE(world.is_ok());
  const std::string& m = world.status().message();
  INFO(m);
  CHECK((m.find("no usable CUDA device") != std::string::npos ||
         m.find("does not exist") != std::string::npos));
  CHECK(shared->slots.empty());
}

TEST_CASE("nccl: a one-rank world runs every collective", "[gpu][nccl]") {
  if (usable_gpus() < 1) TROUPE_SKIP("no usable CUDA device");
  ThreadBootstrap bootstrap(std::make_shared<ThreadBootstrap::Shared>(1), 0);
  auto world = create_nccl_world(bootstrap, 0, test_options());
  REQUIRE(world.is_ok());
  CHECK(world.value()->backend() == "nccl");
  CHECK(world.value()->size() == 1);

  auto everyone = world.value()->everyone();
  REQUIRE(everyone.is_ok());
  Errors errors;
  exercise(*everyone.value(), errors);
  check_no_errors(errors);

  auto self = world.value()->group({0});
  REQUIRE(self.is_ok());
  CHECK(self.value()->size() == 1);
  CHECK(self.value()->rank() == 0);

  // Bad input is a Status, not a crash.
  CHECK_FALSE(world.value()->group({1}).is_ok());
  CHECK_FALSE(world.value()->group({0, 0}).is_ok());
  CHECK_FALSE(world.value()->group({}).is_ok());
  DeviceArray<uint16_t> buf(8);
  const Status st = self.value()->all_reduce(buf.get(), 8, DType::u16, ReduceOp::sum)->wait();
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("cannot be reduced") != std::string::npos);
}

TEST_CASE("nccl: collectives across GPUs match a serial reduction", "[gpu][nccl]") {
  const int gpus = usable_gpus();
  if (gpus < 1) TROUPE_SKIP("no usable CUDA device");
  if (gpus < 2)
    TROUPE_SKIP("needs 2 GPUs (NCCL does not run two ranks of a communicator on one device)");
  const int n = std::min(gpus, 4);
  auto shared = std::make_shared<ThreadBootstrap::Shared>(n);
  Errors errors;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ThreadBootstrap bootstrap(shared, rank);
      auto world = create_nccl_world(bootstrap, rank, test_options());
      if (!ok(world.status(), "create_nccl_world", rank, errors)) return;
      CommWorld& w = *world.value();
      // Groups in one global order: everyone, everyone reversed, then the pairs (0,1), (2,3).
      auto everyone = w.everyone();
      if (!ok(everyone.status(), "everyone()", rank, errors)) return;
      if (everyone.value()->rank() != rank) errors.add("everyone(): wrong rank");
      exercise(*everyone.value(), errors);

      std::vector<int> reversed(n);
      for (int i = 0; i < n; ++i) reversed[i] = n - 1 - i;
      auto rev = w.group(reversed);
      if (!ok(rev.status(), "group(reversed)", rank, errors)) return;
      if (rev.value()->rank() != n - 1 - rank)
        errors.add("group(reversed): rank is not the member position");
      exercise(*rev.value(), errors);

      const int first = rank & ~1;
      if (first + 1 < n) {
        auto pair = w.group({first, first + 1});
        if (!ok(pair.status(), "group(pair)", rank, errors)) return;
        if (pair.value()->size() != 2) errors.add("group(pair): size is not 2");
        exercise(*pair.value(), errors);
      }
    });
  }
  for (auto& t : threads) t.join();
  check_no_errors(errors);
}

#endif  // TROUPE_WITH_CUDA
