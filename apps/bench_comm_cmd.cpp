// troupe bench comm: collective bandwidth as nccl-tests reports it (algbw, busbw), for the local backend
// (N threads of this process) or the ucx backend (the ranks of a job started by troupe launch, SLURM or
// mpirun). One JSON line per (op, size) with --json, in the format bench/mpi_coll_bench prints, so
// bench/run_comm_bench.sh can put troupe and Open MPI side by side.
//
// Size is the total buffer as nccl-tests defines it: the all_reduce buffer, reduce_scatter's send
// buffer (ranks x block), all_gather's receive buffer, all_to_all's send buffer on each rank (ranks x
// the block for one peer; equal counts). time = max over ranks of the mean time per op; algbw = size
// / time; busbw = algbw x 2(n-1)/n (all_reduce), x (n-1)/n (reduce_scatter, all_gather, all_to_all).
// The first call of every size is checked exactly against the serial result (integer-valued floats,
// exact in bf16/f16 too). --dtype f32|bf16|f16 picks the element type: a size is bytes, so bf16 at
// a given size moves as many bytes as f32 (twice the elements); compare equal element counts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "comm/bootstrap/caf_bootstrap.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "kernels/half.hpp"
#include "comm/local/local_world.hpp"
#include "comm/ucx/ucx_world.hpp"

namespace troupe::apps {

namespace {

struct CommBenchArgs {
  std::string backend = "ucx";
  int ranks = 2;  // local only
  std::string ops = "all_reduce,reduce_scatter,all_gather";
  int64_t min_bytes = 4096;
  int64_t max_bytes = int64_t{256} << 20;
  double seconds_per_size = 0.3;
  int warmup = 2;
  bool json = false;
  std::string dtype = "f32";
};

struct Row {
  std::string op;
  int ranks;
  int64_t bytes;
  double time_us, algbw, busbw;
};

using Clock = std::chrono::steady_clock;

// Runs one collective of `op` on `bytes` total; buffers are the caller's and sized for the largest.
comm::WorkPtr issue(comm::Communicator& c, const std::string& op, int64_t bytes, DType dtype, float* send,
                    float* recv) {
  const int n = c.size();
  const size_t elems = static_cast<size_t>(bytes) / dtype_size(dtype);
  if (op == "all_reduce") return c.all_reduce(send, elems, dtype, comm::ReduceOp::sum);
  if (op == "reduce_scatter") return c.reduce_scatter(send, recv, elems / n, dtype, comm::ReduceOp::sum);
  if (op == "all_to_all") return c.all_to_all(send, recv, elems / n, dtype);
  return c.all_gather(send, recv, elems / n, dtype);
}

// Element i of a buffer of `dtype` (f32, bf16 or f16), as a float, and written from one.
float get(const void* p, size_t i, DType dtype) {
  if (dtype == DType::f32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dtype == DType::bf16 ? half::bf16_to_f32(h) : half::f16_to_f32(h);
}
void put(void* p, size_t i, float v, DType dtype) {
  if (dtype == DType::f32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == DType::bf16 ? half::f32_to_bf16(v) : half::f32_to_f16(v);
  }
}

// Exact check of one call with inputs x[i] = rank + 1 + (i % 7) on every rank (sums up to 84 at 8
// ranks: exact in bf16 and f16 at every partial sum).
Status check(comm::Communicator& c, const std::string& op, int64_t bytes, DType dtype, float* send, float* recv) {
  const int n = c.size(), r = c.rank();
  const size_t elems = static_cast<size_t>(bytes) / dtype_size(dtype), block = elems / n;
  auto fill = [&](float* p, size_t count, int rank) {
    for (size_t i = 0; i < count; ++i) put(p, i, static_cast<float>(rank + 1 + static_cast<int>(i % 7)), dtype);
  };
  const double ranks_sum = n * (n + 1) / 2.0;
  size_t bad = 0;
  if (op == "all_reduce") {
    fill(send, elems, r);
    TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send, recv)->wait());
    for (size_t i = 0; i < elems; ++i)
      bad += get(send, i, dtype) != static_cast<float>(ranks_sum + n * static_cast<double>(i % 7));
  } else if (op == "reduce_scatter") {
    fill(send, block * n, r);
    TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send, recv)->wait());
    for (size_t i = 0; i < block; ++i)
      bad += get(recv, i, dtype) != static_cast<float>(ranks_sum + n * static_cast<double>((r * block + i) % 7));
  } else if (op == "all_to_all") {
    // Element i of the block from rank s to rank d: a small integer of (s, d, i), exact in 16 bits.
    auto value = [](int s, int d, size_t i) { return static_cast<float>((s * 7 + d * 3 + static_cast<int>(i % 5)) % 97); };
    for (int d = 0; d < n; ++d)
      for (size_t i = 0; i < block; ++i) put(send, d * block + i, value(r, d, i), dtype);
    TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send, recv)->wait());
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < block; ++i) bad += get(recv, s * block + i, dtype) != value(s, r, i);
  } else {
    fill(send, block, r);
    TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send, recv)->wait());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < block; ++i)
        bad += get(recv, q * block + i, dtype) != static_cast<float>(q + 1 + static_cast<int>(i % 7));
  }
  if (bad) return Status::error(fmt::format("{} of {} bytes on {} ranks: {} wrong elements on rank {}", op, bytes, n, bad, r));
  return Status::ok();
}

// max over ranks of a double, through the communicator itself.
Result<double> max_over_ranks(comm::Communicator& c, double v) {
  double x = v;
  TROUPE_RETURN_IF_ERROR(c.all_reduce(&x, 1, DType::f64, comm::ReduceOp::max)->wait());
  return x;
}

// The benchmark loop every rank runs; rows are filled on rank 0.
Status run_bench(comm::Communicator& c, const CommBenchArgs& a, const std::vector<std::string>& ops,
                 DType dtype, std::vector<Row>* rows) {
  const int n = c.size();
  const int64_t esz = static_cast<int64_t>(dtype_size(dtype));
  std::vector<float> send(static_cast<size_t>(a.max_bytes / 4) + 64), recv(send.size());
  for (const std::string& op : ops) {
    for (int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 2) {
      if (bytes / esz < n) continue;
      TROUPE_RETURN_IF_ERROR(check(c, op, bytes, dtype, send.data(), recv.data()));
      for (int w = 0; w < a.warmup; ++w)
        TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send.data(), recv.data())->wait());
      // Iterations so that one size takes about seconds_per_size; every rank agrees (max of probes).
      auto t0 = Clock::now();
      TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send.data(), recv.data())->wait());
      auto probe = max_over_ranks(c, std::chrono::duration<double>(Clock::now() - t0).count());
      if (!probe) return probe.status();
      const int iters = static_cast<int>(std::clamp(a.seconds_per_size / std::max(probe.value(), 1e-7), 3.0, 200.0));
      TROUPE_RETURN_IF_ERROR(c.barrier()->wait());
      t0 = Clock::now();
      for (int i = 0; i < iters; ++i)
        TROUPE_RETURN_IF_ERROR(issue(c, op, bytes, dtype, send.data(), recv.data())->wait());
      const double mean = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      auto t = max_over_ranks(c, mean);
      if (!t) return t.status();
      if (c.rank() == 0) {
        const double algbw = static_cast<double>(bytes) / t.value() / 1e9;
        const double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        rows->push_back({op, n, bytes, t.value() * 1e6, algbw, algbw * factor});
      }
    }
  }
  return Status::ok();
}

void print_rows(const std::vector<Row>& rows, const std::string& impl, bool json, DType dtype) {
  if (!json)
    std::printf("%-15s %5s %6s %12s %12s %12s %12s\n", "op", "dtype", "ranks", "bytes", "time (us)", "algbw GB/s",
                "busbw GB/s");
  for (const Row& r : rows) {
    if (json)
      std::printf("{\"impl\":\"%s\",\"op\":\"%s\",\"dtype\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"time_us\":%.3f,"
                  "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f}\n",
                  impl.c_str(), r.op.c_str(), dtype_name(dtype), r.ranks, static_cast<long long>(r.bytes), r.time_us,
                  r.algbw, r.busbw);
    else
      std::printf("%-15s %5s %6d %12lld %12.1f %12.3f %12.3f\n", r.op.c_str(), dtype_name(dtype), r.ranks,
                  static_cast<long long>(r.bytes), r.time_us, r.algbw, r.busbw);
  }
  std::fflush(stdout);
}

Result<std::vector<std::string>> parse_ops(const std::string& list) {
  std::vector<std::string> ops;
  std::stringstream ss(list);
  std::string op;
  while (std::getline(ss, op, ',')) {
    if (op != "all_reduce" && op != "reduce_scatter" && op != "all_gather" && op != "all_to_all")
      return Status::error("--ops: unknown collective '" + op +
                           "' -- use all_reduce, reduce_scatter, all_gather, all_to_all");
    ops.push_back(op);
  }
  if (ops.empty()) return Status::error("--ops is empty -- name at least one collective");
  return ops;
}

int run_comm_bench(const CommBenchArgs& a) {
  const std::string name = "bench comm";
  auto ops = parse_ops(a.ops);
  if (!ops) {
    print_error(name, ops.status());
    return kExitUsage;
  }
  if (a.min_bytes < 4 || a.max_bytes < a.min_bytes) {
    print_error(name, "--min-bytes must be >= 4 and <= --max-bytes");
    return kExitUsage;
  }
  DType dtype = DType::f32;
  if (a.dtype == "bf16") {
    dtype = DType::bf16;
  } else if (a.dtype == "f16") {
    dtype = DType::f16;
  } else if (a.dtype != "f32") {
    print_error(name, "--dtype must be f32, bf16 or f16");
    return kExitUsage;
  }
  std::vector<Row> rows;
  if (a.backend == "local") {
    if (a.ranks < 1) {
      print_error(name, "--ranks must be positive");
      return kExitUsage;
    }
    auto fabric = comm::LocalFabric::create(a.ranks);
    if (!fabric) {
      print_error(name, fabric.status());
      return kExitFailure;
    }
    std::vector<Status> status(a.ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < a.ranks; ++r) {
      threads.emplace_back([&, r] {
        auto world = fabric.value().world(r);
        auto everyone = world->everyone();
        if (!everyone) {
          status[r] = everyone.status();
        } else {
          status[r] = run_bench(*everyone.value(), a, ops.value(), dtype, &rows);
        }
        if (!status[r]) fabric.value().abort(r, status[r].message());
      });
    }
    for (auto& t : threads) t.join();
    for (const Status& s : status)
      if (!s) {
        print_error(name, s);
        return kExitFailure;
      }
    print_rows(rows, "troupe-local", a.json, dtype);
    return kExitOk;
  }
  if (a.backend != "ucx") {
    print_error(name, "--backend must be local or ucx");
    return kExitUsage;
  }
  auto env = comm::detect_launch_env();
  if (!env) {
    print_error(name, env.status());
    return kExitUsage;
  }
  auto bootstrap = comm::create_caf_bootstrap(env.value());
  if (!bootstrap) {
    print_error(name, bootstrap.status());
    return kExitFailure;
  }
  auto world = comm::create_ucx_world(*bootstrap.value());
  if (!world) {
    print_error(name, world.status());
    return kExitFailure;
  }
  auto everyone = world.value()->everyone();
  if (!everyone) {
    print_error(name, everyone.status());
    return kExitFailure;
  }
  Status st = run_bench(*everyone.value(), a, ops.value(), dtype, &rows);
  if (!st) {
    print_error(name, st);
    return kExitFailure;
  }
  if (env.value().rank == 0) print_rows(rows, "troupe-ucx", a.json, dtype);
  return kExitOk;
}

}  // namespace

void add_bench_comm_subcommand(CLI::App* bench, int* exit_code) {
  auto a = std::make_shared<CommBenchArgs>();
  CLI::App* cmd = bench->add_subcommand("comm", "Collective bandwidth (algbw/busbw as nccl-tests defines them)");
  cmd->add_option("--backend", a->backend, "local (threads of this process) or ucx (ranks of a launched job)")
      ->capture_default_str();
  cmd->add_option("--ranks", a->ranks, "ranks for --backend local")->capture_default_str();
  cmd->add_option("--ops", a->ops, "comma-separated collectives: all_reduce, reduce_scatter, all_gather, all_to_all")
      ->capture_default_str();
  cmd->add_option("--min-bytes", a->min_bytes, "smallest total size")->capture_default_str();
  cmd->add_option("--max-bytes", a->max_bytes, "largest total size")->capture_default_str();
  cmd->add_option("--seconds-per-size", a->seconds_per_size, "timed work per size")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed calls per size")->capture_default_str();
  cmd->add_flag("--json", a->json, "one JSON line per (op, size)");
  cmd->add_option("--dtype", a->dtype, "element type: f32, bf16 or f16")->capture_default_str();
  cmd->callback([a, exit_code] { *exit_code = run_comm_bench(*a); });
}

}  // namespace troupe::apps
