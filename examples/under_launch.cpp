// One program, one process or many: troupe::train finds the launch environment. Run as it is, the
// pipeline 2 x data 2 layout runs as 4 rank actors in this process; under
//   troupe launch --nproc-per-node 4 -- ./under_launch LOSSES_FILE
// each process holds one rank, the ranks meet at the launcher's rendezvous, and rank 0 writes the
// same losses (tests/cli/examples.sh compares the two files within 1e-5).
#include <fstream>

#include "example_util.hpp"

int main(int argc, char** argv) {
  using namespace example;
  if (argc != 2) fail("usage: under_launch LOSSES_FILE");
  troupe::TrainConfig cfg = with_mock_data(small_gpt(5));
  cfg.pipeline_model_parallel_size = 2;
  cfg.data_parallel_size = 2;
  cfg.num_threads = 1;
  int rank = -1, world = 0;
  std::vector<double> losses;
  troupe::TrainCallbacks cb;
  cb.on_start = [&](const troupe::TrainConfig&, const troupe::DataSource&, int r, int w) {
    rank = r;
    world = w;
    return troupe::Status::ok();
  };
  cb.on_iteration = [&](const troupe::IterationStats& s) { losses.push_back(s.lm_loss); };
  troupe::RunOptions options;
  options.measure_peak = false;
  auto result = troupe::train(cfg, nullptr, cb, options);
  if (!result) fail("rank " + std::to_string(rank) + ": " + result.status().message());
  if (rank == 0) {
    std::ofstream out(argv[1]);
    out.precision(17);
    for (double l : losses) out << l << "\n";
    std::printf("rank 0 of %d process(es): %zu iterations, last loss %.6f\n", world, losses.size(), losses.back());
  }
  return 0;
}
