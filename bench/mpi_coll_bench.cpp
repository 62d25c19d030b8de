// Open MPI collectives measured the way nccl-tests measures NCCL: the peer that troupe's
// `bench comm` is compared with (bench/run_comm_bench.sh).
//   mpirun -np N build/bench/mpi_coll_bench [--min-bytes 4096] [--max-bytes 268435456]
//          [--ops all_reduce,reduce_scatter,all_gather,all_to_all] [--iters 20] [--warmup 5]
//
// size = the total buffer in bytes, as nccl-tests defines it: all_reduce the buffer; reduce_scatter
// the send buffer (ranks x recv block); all_gather the recv buffer (ranks x send block); all_to_all
// each rank's send buffer (ranks x the block for one peer), run as MPI_Alltoallv with equal counts
// (the call troupe's all_to_all_v is compared with; MoE exchanges have uneven counts). Sizes
// double from --min-bytes to --max-bytes, rounded down to a multiple of 4 x ranks (float elements,
// equal blocks); the JSON reports the size actually moved. Per (op, size): `warmup` untimed calls,
// then `iters` timed calls back to back (both scaled down above 8 MiB, at least 3 timed), after a
// barrier. time = max over ranks of (elapsed / iters); algbw = size / time; busbw = algbw x
// 2(n-1)/n for all_reduce, x (n-1)/n for reduce_scatter, all_gather and all_to_all (nccl-tests'
// PERFORMANCE.md). Rank 0 prints one JSON line per (op, size):
//   {"impl":"openmpi","op":"all_reduce","ranks":4,"bytes":1048576,"time_us":..,
//    "algbw_GBps":..,"busbw_GBps":..}  (on one line)
// GB = 1e9 bytes. The first warm-up call of every size is checked against the exact result
// (integer-valued floats); a wrong result prints an error and exits 1.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Args {
  size_t min_bytes = 4096;
  size_t max_bytes = size_t{256} << 20;
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  int iters = 20;
  int warmup = 5;
};

bool parse_size(const char* s, size_t* out) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s) return false;
  size_t mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = size_t{1} << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = size_t{1} << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = size_t{1} << 30, ++end;
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v) * mult;
  return true;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Returns an empty string on success, else the message to print.
std::string parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return "help";
    if (i + 1 >= argc) return "flag " + flag + " needs a value";
    const char* v = argv[++i];
    if (flag == "--min-bytes") {
      if (!parse_size(v, &a->min_bytes)) return "--min-bytes takes a byte count such as 4096 or 4K";
    } else if (flag == "--max-bytes") {
      if (!parse_size(v, &a->max_bytes))
        return "--max-bytes takes a byte count such as 268435456 or 256M";
    } else if (flag == "--ops") {
      a->ops = split_commas(v);
    } else if (flag == "--iters") {
      a->iters = std::atoi(v);
    } else if (flag == "--warmup") {
      a->warmup = std::atoi(v);
    } else {
      return "unknown flag " + flag;
    }
  }
  if (a->min_bytes == 0 || a->min_bytes > a->max_bytes)
    return "need 0 < --min-bytes <= --max-bytes";
  if (a->iters < 1 || a->warmup < 0) return "need --iters >= 1 and --warmup >= 0";
  if (a->ops.empty())
    return "--ops is empty; give some of all_reduce,reduce_scatter,all_gather,all_to_all";
  for (const auto& op : a->ops) {
    if (op != "all_reduce" && op != "reduce_scatter" && op != "all_gather" && op != "all_to_all") {
      return "unknown op '" + op + "'; --ops takes all_reduce,reduce_scatter,all_gather,all_to_all";
    }
  }
  return "";
}

// Rank r's input element i: an integer small enough that sums over ranks stay exact in float.
float input_value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
}

// all_to_all: element i of the block rank `from` sends rank `to` (small integers, exact).
float a2a_value(int from, int to, size_t i) {
  return static_cast<float>((from * 7 + to * 3 + static_cast<int>(i % 5)) % 97);
}

struct Buffers {
  std::vector<float> send, recv;
  std::vector<int> counts, displs;  // all_to_all: per peer, in elements (the same both ways)
};

// One call of `op`. count = all_reduce elements, or the per-rank block of the others.
void run_op(const std::string& op, Buffers& b, size_t count) {
  const int c = static_cast<int>(count);
  if (op == "all_to_all") {
    MPI_Alltoallv(b.send.data(), b.counts.data(), b.displs.data(), MPI_FLOAT, b.recv.data(),
                  b.counts.data(), b.displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  } else if (op == "all_reduce") {
    MPI_Allreduce(b.send.data(), b.recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (op == "reduce_scatter") {
    MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    MPI_Allgather(b.send.data(), c, MPI_FLOAT, b.recv.data(), c, MPI_FLOAT, MPI_COMM_WORLD);
  }
}

// Checks the result of one call made with inputs from fill(). Returns the first bad index or -1.
int64_t check(const std::string& op, const Buffers& b, size_t count, int rank, int nranks) {
  const float ranks_sum = static_cast<float>(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < b.recv.size(); ++i) {
    float want;
    if (op == "all_to_all") {
      want = a2a_value(static_cast<int>(i / count), rank, i % count);
    } else if (op == "all_reduce") {
      want = ranks_sum * static_cast<float>(i % 7 + 1);
    } else if (op == "reduce_scatter") {
      want = ranks_sum * static_cast<float>((rank * count + i) % 7 + 1);
    } else {
      want = input_value(static_cast<int>(i / count), i % count);
    }
    if (b.recv[i] != want) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Args args;
  const std::string err = parse_args(argc, argv, &args);
  if (!err.empty()) {
    if (rank == 0) {
      if (err != "help") std::fprintf(stderr, "mpi_coll_bench: %s\n", err.c_str());
      std::fprintf(stderr,
                   "usage: mpirun -np N mpi_coll_bench [--min-bytes 4096] [--max-bytes 268435456]\n"
                   "       [--ops all_reduce,reduce_scatter,all_gather,all_to_all] [--iters 20] "
                   "[--warmup 5]\n");
    }
    MPI_Finalize();
    return err == "help" ? 0 : 2;
  }

  const size_t unit = sizeof(float) * static_cast<size_t>(nranks);
  for (const std::string& op : args.ops) {
    for (size_t want = args.min_bytes; want <= args.max_bytes; want *= 2) {
      const size_t bytes = want / unit * unit;
      if (bytes == 0) continue;
      const size_t total = bytes / sizeof(float);  // elements of the nccl-tests "size"
      const size_t block = total / nranks;         // per-rank block (rs recv, ag send)
      if (total > static_cast<size_t>(INT32_MAX)) {
        if (rank == 0)
          std::fprintf(stderr, "mpi_coll_bench: %zu bytes exceeds MPI's int count\n", bytes);
        break;
      }
      Buffers b;
      const bool ar = op == "all_reduce", rs = op == "reduce_scatter", a2a = op == "all_to_all";
      b.send.resize(ar || rs || a2a ? total : block);
      b.recv.resize(ar || !rs ? total : block);
      const size_t count = ar ? total : block;
      for (size_t i = 0; i < b.send.size(); ++i) b.send[i] = input_value(rank, i);
      if (a2a) {
        b.counts.assign(static_cast<size_t>(nranks), static_cast<int>(block));
        b.displs.resize(static_cast<size_t>(nranks));
        for (int q = 0; q < nranks; ++q) {
          b.displs[static_cast<size_t>(q)] = q * static_cast<int>(block);
          for (size_t i = 0; i < block; ++i)
            b.send[static_cast<size_t>(q) * block + i] = a2a_value(rank, q, i);
        }
      }
      std::fill(b.recv.begin(), b.recv.end(), -1.0f);

      // Scale the calls down for large sizes so a 256 MiB point takes seconds, not minutes.
      const double scale = std::min(1.0, double(8 << 20) / double(bytes));
      const int iters = std::max(3, static_cast<int>(std::lround(args.iters * scale)));
      const int warmup =
          args.warmup == 0 ? 0 : std::max(1, static_cast<int>(std::lround(args.warmup * scale)));

      // Correctness of the first call (even with --warmup 0 it runs once, untimed).
      run_op(op, b, count);
      const int64_t bad = check(op, b, count, rank, nranks);
      int any_bad = bad >= 0 ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (any_bad) {
        if (bad >= 0) {
          std::fprintf(
              stderr,
              "mpi_coll_bench: rank %d: %s of %zu bytes gave a wrong value at element %lld\n", rank,
              op.c_str(), bytes, static_cast<long long>(bad));
        }
        MPI_Finalize();
        return 1;
      }
      for (int i = 1; i < warmup; ++i) run_op(op, b, count);

      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) run_op(op, b, count);
      double seconds = (MPI_Wtime() - t0) / iters;
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

      if (rank == 0) {
        const double n = nranks;
        const double algbw = double(bytes) / seconds / 1e9;
        const double factor = ar ? 2.0 * (n - 1) / n : (n - 1) / n;  // all_to_all: (n-1)/n
        std::printf(
            "{\"impl\":\"openmpi\",\"op\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"time_us\":%.2f,"
            "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f}\n",
            op.c_str(), nranks, bytes, seconds * 1e6, algbw, algbw * factor);
        std::fflush(stdout);
      }
      if (want > args.max_bytes / 2) break;  // no overflow on the doubling
    }
  }
  MPI_Finalize();
  return 0;
}
