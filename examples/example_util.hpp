// What the examples share: a small GPT-2 configuration that trains in seconds, a run that records
// its losses, and the checks the examples end with.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <troupe/troupe.hpp>

namespace example {

// 2 layers, hidden 64, 4 heads, 32-token windows, the byte-level tokenizer (no vocabulary files).
// It names no data: pass your own DataSource to troupe::train, or use with_mock_data.
inline troupe::TrainConfig small_gpt(int train_iters) {
  troupe::TrainConfig cfg;
  cfg.model.num_layers = 2;
  cfg.model.hidden_size = 64;
  cfg.model.num_attention_heads = 4;
  cfg.model.seq_length = 32;
  cfg.model.max_position_embeddings = 32;
  cfg.tokenizer_type = "ByteLevelTokenizer";
  cfg.micro_batch_size = 2;
  cfg.global_batch_size = 8;
  cfg.train_iters = train_iters;
  cfg.lr = 1e-3;
  cfg.lr_decay_style = "constant";
  cfg.log_interval = 1;
  cfg.eval_interval = 1000;  // no evaluation in these short runs
  cfg.num_threads = 2;
  return cfg;
}

// The same, trained on Megatron's mock data (synthetic tokens) when no DataSource is given.
inline troupe::TrainConfig with_mock_data(troupe::TrainConfig cfg) {
  cfg.mock_data = true;
  return cfg;
}

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  std::exit(1);
}

inline void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
  std::printf("ok: %s\n", what.c_str());
}

// Trains and returns every iteration's loss; a failed run ends the example with its message.
inline std::vector<double> losses_of(const troupe::TrainConfig& cfg, std::shared_ptr<const troupe::DataSource> data = nullptr,
                                     troupe::RunOptions options = {}) {
  std::vector<double> losses;
  troupe::TrainCallbacks cb;
  cb.on_iteration = [&](const troupe::IterationStats& s) { losses.push_back(s.lm_loss); };
  options.measure_peak = false;
  auto result = troupe::train(cfg, std::move(data), cb, options);
  if (!result) fail("training failed: " + result.status().message());
  return losses;
}

// Every loss of `b` equals `a`'s within `tol` relative.
inline bool same_losses(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-5) {
  if (a.size() != b.size() || a.empty()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > tol * std::abs(a[i])) return false;
  return true;
}

}  // namespace example
