// Training from code: a configuration built in C++, callbacks for iterations, the same model on a
// tensor 2 x pipeline 2 layout (4 rank actors in this process) equal to the 1x1x1 run, a stop
// request, and evaluation of the checkpoint the run saved.
#include <atomic>
#include <filesystem>

#include "example_util.hpp"

int main() {
  using namespace example;
  troupe::TrainConfig cfg = with_mock_data(small_gpt(6));
  const std::vector<double> single = losses_of(cfg);
  check(single.size() == 6, "the 1x1x1 run reported 6 iterations");

  troupe::TrainConfig par = cfg;
  par.tensor_model_parallel_size = 2;
  par.pipeline_model_parallel_size = 2;
  const std::vector<double> layout = losses_of(par);
  check(same_losses(single, layout), "tp 2 x pp 2 gives the 1x1x1 losses within 1e-5");

  // A stop request: the run ends after the iteration in which it was seen, saving a checkpoint.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "troupe_example_ckpt";
  std::filesystem::remove_all(dir);
  troupe::TrainConfig stopping = with_mock_data(small_gpt(100));
  stopping.save = dir.string();
  std::atomic<bool> stop{false};
  troupe::TrainCallbacks cb;
  cb.on_iteration = [&](const troupe::IterationStats& s) {
    if (s.iteration == 3) stop = true;
  };
  troupe::RunOptions options;
  options.stop = &stop;
  options.measure_peak = false;
  auto summary = troupe::train(stopping, nullptr, cb, options);
  if (!summary) fail(summary.status().message());
  check(summary.value().stopped_early && summary.value().iteration <= 4, "the stop request ended the run early");
  check(summary.value().last_checkpoint == dir.string(), "it saved a checkpoint on the way out");

  // Evaluate that checkpoint on the run's own data, as `troupe eval` does.
  stopping.model.vocab_size = 257;  // the byte-level tokenizer's
  auto data = troupe::open_data(stopping);
  if (!data) fail(data.status().message());
  auto eval = troupe::evaluate(dir.string(), data.value(), 16, 2, 2);
  if (!eval) fail(eval.status().message());
  check(std::isfinite(eval.value().loss) && eval.value().iteration == summary.value().iteration,
        "evaluate() loaded the checkpoint of iteration " + std::to_string(eval.value().iteration));
  std::filesystem::remove_all(dir);

  // Bad input is a Status, never a crash: every problem names the setting.
  troupe::TrainConfig bad = with_mock_data(small_gpt(2));
  bad.model.num_attention_heads = 5;  // does not divide hidden 64
  auto refused = troupe::train(bad, nullptr);
  check(!refused && refused.status().is_bad_input(), "a bad configuration is refused: " + refused.status().message());
  return 0;
}
