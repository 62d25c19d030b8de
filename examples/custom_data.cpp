// Your own data instead of an indexed dataset: a DataSource that makes its windows itself (here a
// counting pattern a model can learn: each token is the previous one plus one, modulo 40), trained
// on data-parallel 2 with ZeRO stage 2, equal to the 1x1x1 run and learning. The config names no
// data at all (no data_path, no mock_data): the DataSource is the run's data.
#include <memory>

#include "example_util.hpp"

namespace {

class CountingData : public troupe::DataSource {
 public:
  explicit CountingData(int64_t seq_length) : seq_length_(seq_length) {}
  int64_t seq_length() const override { return seq_length_; }
  int64_t num_windows(troupe::DataSplit split) const override {
    return split == troupe::DataSplit::train ? 4096 : 64;
  }
  // May be called from several threads at once (the DataSource contract): this one keeps no state.
  troupe::Status read(troupe::DataSplit split, int64_t sample, int32_t* out) const override {
    const int64_t start = (sample * 7919 + static_cast<int64_t>(split) * 13) % 40;
    for (int64_t i = 0; i <= seq_length_; ++i) out[i] = static_cast<int32_t>(10 + (start + i) % 40);
    return troupe::Status::ok();
  }
  std::string describe() const override { return "counting windows (example)"; }

 private:
  int64_t seq_length_;
};

}  // namespace

int main() {
  using namespace example;
  troupe::TrainConfig cfg = small_gpt(40);
  cfg.lr = 3e-3;
  auto data = std::make_shared<CountingData>(cfg.model.seq_length);
  check(!cfg.mock_data && cfg.data_path.empty() && cfg.train_data_path.empty(), "the config names no data");
  const std::vector<double> single = losses_of(cfg, data);

  troupe::TrainConfig dp = cfg;
  dp.data_parallel_size = 2;
  dp.zero_stage = 2;
  const std::vector<double> zero = losses_of(dp, data);
  check(same_losses(single, zero), "dp 2 with ZeRO-2 gives the 1x1x1 losses within 1e-5");
  std::printf("loss: first %.4f, last %.4f\n", single.front(), single.back());
  check(single.back() < 0.25 * single.front(), "the model learns the pattern (the loss falls below a quarter)");

  // A config that names data as well would leave one of the two unused: refused, naming both.
  troupe::TrainConfig both = cfg;
  both.data_path = {"my_text_document"};
  auto refused = troupe::train(both, data);
  check(!refused && refused.status().is_bad_input() &&
            refused.status().message().find("--data-path") != std::string::npos &&
            refused.status().message().find("DataSource") != std::string::npos,
        "a DataSource beside a config that names data is refused: " +
            (refused ? std::string("(it trained)") : refused.status().message()));
  return 0;
}
