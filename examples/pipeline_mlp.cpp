// A model that is not GPT: the classifier MLP of examples/mlp_stages.hpp (an input block, two
// hidden blocks, a loss head; the label travels between the stages as an integer tensor) on
// generated data, split over 2 pipeline stages with data-parallel 2 and ZeRO stage 3. It gives the
// single-stage losses within 1e-5, and it learns.
#include <memory>

#include "example_util.hpp"
#include "mlp_stages.hpp"

namespace {

constexpr int64_t kFeatures = 16, kClasses = 4;

// Samples of kFeatures pixel-like values 0..255 and a label: each class has its own pattern of
// bright and dark features, with noise.
class PatternData : public troupe::DataSource {
 public:
  int64_t seq_length() const override { return kFeatures; }
  int64_t num_windows(troupe::DataSplit split) const override { return split == troupe::DataSplit::train ? 4096 : 64; }
  troupe::Status read(troupe::DataSplit split, int64_t sample, int32_t* out) const override {
    uint64_t h = static_cast<uint64_t>(sample) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(split) + 1;
    auto next = [&h] {
      h ^= h >> 31;
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 29;
      return h;
    };
    const int64_t label = static_cast<int64_t>(next() % kClasses);
    for (int64_t f = 0; f < kFeatures; ++f) {
      const bool bright = ((f * 7 + label * 5) % kClasses) < 2;
      const int64_t noise = static_cast<int64_t>(next() % 81) - 40;
      out[f] = static_cast<int32_t>(std::clamp<int64_t>((bright ? 200 : 60) + noise, 0, 255));
    }
    out[kFeatures] = static_cast<int32_t>(label);
    return troupe::Status::ok();
  }
  std::string describe() const override { return "class patterns (example)"; }
};

std::vector<double> train_mlp(const troupe::TrainConfig& cfg, int virtual_stages) {
  troupe::RunOptions run;
  run.model = std::make_shared<troupe::Model>(example::mlp_model({kFeatures, 32, kClasses}, 2, virtual_stages));
  return example::losses_of(cfg, std::make_shared<PatternData>(), run);
}

}  // namespace

int main() {
  using namespace example;
  troupe::TrainConfig cfg = small_gpt(30);
  // Only seq_length matters to this model: the samples' length (features; the label follows). The
  // data is ours: the config names none.
  cfg.model.seq_length = kFeatures;
  cfg.model.max_position_embeddings = kFeatures;
  cfg.lr = 1e-2;
  const std::vector<double> single = train_mlp(cfg, 1);

  troupe::TrainConfig par = cfg;
  par.pipeline_model_parallel_size = 2;
  par.data_parallel_size = 2;
  par.zero_stage = 3;
  const std::vector<double> split = train_mlp(par, 2);
  check(same_losses(single, split), "pp 2 x dp 2 with ZeRO-3 gives the single-stage losses within 1e-5");
  std::printf("MLP: first loss %.4f, last %.4f\n", single.front(), single.back());
  check(single.back() < 0.3 * single.front(), "the MLP learns the classes (the loss falls below 30%)");
  return 0;
}
