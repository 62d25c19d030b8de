// A custom loss head on GPT: GPT's layers as troupe train splits them, then the user's own stage
// (examples/zloss_head.hpp: an untied, vocabulary-parallel output layer with PaLM's z-loss) in
// place of GPT's head. Trained on tensor 2 x pipeline 2 it gives the 1x1x1 losses within 1e-5; it
// is another model than GPT's own (other losses); and a head that does not fit is refused with the
// reason before anything runs.
#include <memory>

#include "example_util.hpp"
#include "zloss_head.hpp"

namespace {

// A head that expects the wrong width: the model's check names the mismatch.
class WrongWidth final : public troupe::Stage {
 public:
  explicit WrongWidth(const troupe::StagePlace& at) : rows_(at.micro_batch * (at.record_length - 1)) {}
  std::vector<troupe::TensorDecl> inputs() const override { return {{"hidden", {rows_, 48}}}; }
  std::vector<troupe::TensorDecl> outputs() const override { return {}; }
  std::vector<troupe::ParamDecl> parameters() const override { return {}; }
  bool has_loss() const override { return true; }
  double forward(troupe::StageContext&, const troupe::ForwardArgs&) override { return 0; }
  void backward(troupe::StageContext&, const troupe::BackwardArgs&) override {}

 private:
  int64_t rows_;
};

troupe::RunOptions with_model(troupe::Model m) {
  troupe::RunOptions run;
  run.model = std::make_shared<troupe::Model>(std::move(m));
  return run;
}

}  // namespace

int main() {
  using namespace example;
  troupe::TrainConfig cfg = with_mock_data(small_gpt(6));
  const std::vector<double> single = losses_of(cfg, nullptr, with_model(gpt_with_zloss_head(cfg)));

  troupe::TrainConfig par = cfg;
  par.tensor_model_parallel_size = 2;
  par.pipeline_model_parallel_size = 2;
  const std::vector<double> layout = losses_of(par, nullptr, with_model(gpt_with_zloss_head(par)));
  check(same_losses(single, layout), "the z-loss head on tp 2 x pp 2 gives its 1x1x1 losses within 1e-5");
  std::printf("z-loss head: first loss %.5f, last %.5f\n", single.front(), single.back());

  const std::vector<double> gpt_head = losses_of(cfg);
  check(!same_losses(single, gpt_head, 1e-4), "it is not GPT's own tied head (the losses differ)");

  troupe::Model wrong = troupe::gpt_model(cfg, false);
  wrong.stages.back().push_back(troupe::Block::custom(
      "wrong_width", [](const troupe::StagePlace& at) { return std::make_unique<WrongWidth>(at); }));
  troupe::RunOptions run = with_model(std::move(wrong));
  run.measure_peak = false;
  auto refused = troupe::train(cfg, nullptr, {}, run);
  check(!refused && refused.status().is_bad_input() &&
            refused.status().message().find("takes hidden (64, 48) f32 but") != std::string::npos,
        "a head of the wrong width is refused: " + (refused ? std::string("(ran)") : refused.status().message()));
  return 0;
}
