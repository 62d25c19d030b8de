// One checkpoint shard written to a file (a tmpfs by default: an in-memory snapshot's write), timed
// on the writing thread's CPU clock and the wall clock: what a snapshot's or save's background write
// costs the machine (docs/PERFORMANCE.md, "In-memory snapshots"). The shard has run_save_bench.sh's
// sizes by default (8 layers of hidden 512 and a byte-level vocabulary: 289 MiB with both Adam moments).
//   bench_shard_write [--dir /dev/shm] [--layers 8] [--hidden 512] [--repeat 5]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "storage/shard_file.hpp"
#include "storage/write_pacing.hpp"

namespace {

troupe::ShardContents make_shard(int layers, int64_t hidden, std::mt19937& rng) {
  using namespace troupe;
  std::vector<std::pair<std::string, Shape>> tensors = {{"wte", Shape{512, hidden}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    tensors.push_back({p + "attn.qkv.weight", Shape{3 * hidden, hidden}});
    tensors.push_back({p + "attn.proj.weight", Shape{hidden, hidden}});
    tensors.push_back({p + "mlp.fc.weight", Shape{4 * hidden, hidden}});
    tensors.push_back({p + "mlp.proj.weight", Shape{hidden, 4 * hidden}});
    tensors.push_back({p + "ln.weight", Shape{hidden}});
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  ShardContents c;
  for (ShardSection s : {ShardSection::model, ShardSection::exp_avg, ShardSection::exp_avg_sq})
    for (const auto& [name, shape] : tensors) {
      TensorPiece p;
      p.name = name;
      p.global_shape = shape;
      p.runs = {{0, shape.numel()}};
      p.values = Tensor::empty(Shape{shape.numel()}, DType::f32);
      float* v = p.values.data<float>();
      const float base = u(rng);
      for (int64_t i = 0; i < shape.numel(); ++i) v[i] = base + 1e-3f * static_cast<float>(i % 1000);
      c.sections[s].push_back(std::move(p));
    }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/dev/shm";
  int layers = 8, repeat = 5;
  int64_t hidden = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    else if (flag == "--layers") layers = std::atoi(argv[i + 1]);
    else if (flag == "--hidden") hidden = std::atoll(argv[i + 1]);
    else if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_shard_write: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  std::mt19937 rng(7);
  const troupe::ShardContents shard = make_shard(layers, hidden, rng);
  const std::string folder = dir + "/troupe-shard-write-bench." + std::to_string(getpid());
  std::printf("%-8s %10s %12s %10s %10s\n", "write", "MiB", "image KiB", "cpu s", "wall s");
  for (int r = 0; r < repeat; ++r) {
    const std::string path = folder + "/iter_" + std::to_string(r) + "/shard_00000.h5";
    const double c0 = troupe::thread_cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    troupe::ShardWriteStats stats;
    troupe::Status st = troupe::write_shard_file(path, 0, shard, &stats);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    const double cpu = troupe::thread_cpu_seconds() - c0;
    if (!st) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      return 1;
    }
    std::printf("%-8d %10.1f %12.1f %10.3f %10.3f\n", r,
                static_cast<double>(std::filesystem::file_size(path)) / (1 << 20),
                static_cast<double>(stats.image_bytes) / 1024, cpu, wall);
    if (r > 0) std::filesystem::remove_all(folder + "/iter_" + std::to_string(r - 1));
  }
  std::filesystem::remove_all(folder);
  return 0;
}
