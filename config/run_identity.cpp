#include "config/run_identity.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "storage/sharded_checkpoint.hpp"

namespace troupe {

namespace {

using nlohmann::json;

std::string text(double v) { return fmt::format("{:g}", v); }
std::string text(int64_t v) { return std::to_string(v); }
std::string text(int v) { return std::to_string(v); }
std::string text(uint64_t v) { return std::to_string(v); }
std::string text(const std::string& v) { return v.empty() ? "(none)" : v; }
std::string text(bool v) { return v ? "on" : "off"; }
std::string text(Normalization v) { return to_string(v); }
std::string text(PositionEmbedding v) { return to_string(v); }
std::string text(MlpActivation v) { return to_string(v); }
std::string text(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& item : v) out += (out.empty() ? "" : " ") + item;
  return text(out);
}

// Collects the differences of one comparison: a refusal names the flag, both values and the fix.
struct Differences {
  ResumeCheck& out;
  template <class T>
  void must_agree(const char* flag, const T& now, const T& saved, const std::string& fix) {
    if (now == saved) return;
    out.refused.push_back(std::string(flag) + " is " + text(now) + " but the checkpoint's run used " + text(saved) +
                          " -- " + fix);
  }
  template <class T>
  void may_change(const char* what, const T& now, const T& saved) {
    if (now == saved) return;
    out.changed.push_back(std::string(what) + " " + text(saved) + " -> " + text(now));
  }
};

// The experts of each layer, "0 8 0 8" (0: the dense MLP), or "none" without experts.
std::string experts_per_layer(const GptConfig& m) {
  if (!m.moe.enabled()) return "none";
  std::string out;
  for (int l = 0; l < m.num_layers && l < (1 << 20); ++l) {
    if (!out.empty()) out += ' ';
    out += std::to_string(m.moe.experts_of(l, m.num_layers));
  }
  return out;
}

// Mixture of experts: which tensors an MoE layer has (its router and experts, their widths; the
// experts' c_proj bias only with Megatron-Core's router; PR-MoE's MLP; the shared expert).
void experts_must_agree(Differences& d, const GptConfig& a, const GptConfig& b, const std::string& fix) {
  d.must_agree("the experts of each layer (--num-experts and its layer rule)", experts_per_layer(a),
               experts_per_layer(b), fix);
  if (!a.moe.enabled() || !b.moe.enabled()) return;
  d.must_agree("the MoE router (Megatron-DeepSpeed's or Megatron-LM's flags)", std::string(to_string(a.moe.router)),
               std::string(to_string(b.moe.router)), fix);
  d.must_agree("each expert's width (--moe-ffn-hidden-size)", a.expert_ffn_hidden_size(), b.expert_ffn_hidden_size(),
               fix);
  d.must_agree("--mlp-type residual", a.moe.residual, b.moe.residual, fix);
  d.must_agree("--moe-shared-expert-intermediate-size", a.moe.shared_expert_ffn, b.moe.shared_expert_ffn, fix);
}

// The flags the parameters' shapes follow from (the vocabulary apart: its rule differs).
void shapes_must_agree(Differences& d, const TrainConfig& now, const TrainConfig& saved, const std::string& fix) {
  d.must_agree("--num-layers", now.model.num_layers, saved.model.num_layers, fix);
  d.must_agree("--hidden-size", now.model.hidden_size, saved.model.hidden_size, fix);
  d.must_agree("--num-attention-heads", now.model.num_attention_heads, saved.model.num_attention_heads, fix);
  d.must_agree("--max-position-embeddings", now.model.max_position_embeddings, saved.model.max_position_embeddings,
               fix);
  // The family: which tensors exist and their shapes (norm biases, wpe, the embedding LayerNorm,
  // linear biases, lm_head, the key/value groups, head dimension, MLP width and its two halves),
  // and how positions enter (the same tensors mean something else under rope, ALiBi or none).
  const GptConfig& a = now.model;
  const GptConfig& b = saved.model;
  experts_must_agree(d, a, b, fix);
  d.must_agree("--normalization", a.normalization, b.normalization, fix);
  d.must_agree("--position-embedding-type", a.position_embedding, b.position_embedding, fix);
  d.must_agree("--swiglu (the MLP's activation)", a.activation, b.activation, fix);
  d.must_agree("the linear layers' biases (--disable-bias-linear)", a.add_bias_linear, b.add_bias_linear, fix);
  d.must_agree("--untie-embeddings-and-output-weights", a.untie_embeddings_and_output_weights,
               b.untie_embeddings_and_output_weights, fix);
  d.must_agree("--embed-layernorm", a.embed_layernorm, b.embed_layernorm, fix);
  // The derived sizes (groups, head dimension, MLP width: defaults follow the width and heads) only
  // when the width and heads agree, so that one difference is reported once.
  if (a.hidden_size != b.hidden_size || a.num_attention_heads != b.num_attention_heads) return;
  d.must_agree("the key/value groups (--num-query-groups / --num-key-value-heads)", a.query_groups(), b.query_groups(),
               fix);
  d.must_agree("the head dimension (--kv-channels)", a.head_size(), b.head_size(), fix);
  if (a.activation == b.activation) d.must_agree("--ffn-hidden-size", a.ffn_hidden_size(), b.ffn_hidden_size(), fix);
}

// How rotary turns positions into angles: a resumed run continues the same function; a fine-tune
// may change the base (context extension does) but reports it.
void rotary_must_agree(Differences& d, const GptConfig& a, const GptConfig& b, const std::string& fix) {
  d.must_agree("--rotary-percent", a.rotary_percent, b.rotary_percent, fix);
  d.must_agree("--rotary-interleaved", a.rotary_interleaved, b.rotary_interleaved, fix);
}

int64_t decay_length(const TrainConfig& c) { return c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters; }

// A schedule measured in samples or tokens (Megatron's --train-samples, --lr-warmup-fraction,
// Megatron-DeepSpeed's token lengths): compared by its lengths, as Megatron's scheduler compares
// lr_warmup_steps and lr_decay_steps.
bool beyond_iterations(const TrainConfig& c) {
  return c.train_samples > 0 || c.lr_warmup_fraction >= 0 || c.lr_warmup_tokens >= 0 || c.lr_decay_tokens > 0;
}

}  // namespace

std::string new_run_id() {
  unsigned char bytes[16] = {0};
  bool filled = false;
  if (const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC); fd >= 0) {
    filled = ::read(fd, bytes, sizeof bytes) == static_cast<ssize_t>(sizeof bytes);
    ::close(fd);
  }
  TROUPE_CHECK(filled, "cannot read /dev/urandom for a run id");
  std::string id;
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

std::string run_json(const std::string& run_id) { return json{{"id", run_id}}.dump(); }

std::string run_id_of(const CheckpointMeta& meta) {
  if (meta.run_json.empty()) return "";
  const json j = json::parse(meta.run_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  auto it = j.find("id");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

Result<LatestRun> latest_run(const std::string& dir) {
  LatestRun out;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::exists(std::filesystem::path(dir) / "latest_checkpointed_iteration.txt", ec))
    return out;
  auto it = latest_iteration(dir);
  if (!it) return it.status().as_bad_input();
  auto meta = read_checkpoint_meta(dir, it.value());
  if (!meta) return meta.status().as_bad_input();
  auto cfg = TrainConfig::from_json(meta.value().config_json);
  if (!cfg) return cfg.status().with_context("the config stored in " + iteration_dir(dir, it.value()) + ": ").as_bad_input();
  out.found = true;
  out.iteration = it.value();
  out.run_id = run_id_of(meta.value());
  out.config = std::move(cfg).value();
  return out;
}

Status ResumeCheck::status(const std::string& dir, bool finetune) const {
  if (refused.empty()) return Status::ok();
  std::string message = (finetune ? "cannot fine-tune from the checkpoint in " : "cannot resume the run of the checkpoint in ") + dir + ":";
  for (const std::string& r : refused) message += "\n  " + r;
  return Status::bad_input(message);
}

ResumeCheck check_resume(const TrainConfig& now, const TrainConfig& saved) {
  ResumeCheck out;
  Differences d{out};
  shapes_must_agree(d, now, saved, "the model's shape cannot change on resume; pass the checkpoint's value");
  rotary_must_agree(d, now.model, saved.model, "the model cannot change on resume; pass the checkpoint's value");
  d.must_agree("--rotary-base", now.model.rotary_base, saved.model.rotary_base,
               "the model cannot change on resume; pass the checkpoint's value");
  d.must_agree("--tokenizer-type", now.tokenizer_type, saved.tokenizer_type,
               "use the tokenizer (and vocabulary files) the checkpoint was trained with");
  if (now.tokenizer_type == saved.tokenizer_type)
    d.must_agree("the vocabulary size", now.model.vocab_size, saved.model.vocab_size,
                 "use the vocabulary files the checkpoint was trained with");
  d.must_agree("--seed", now.seed, saved.seed,
               "the seed fixes the initialisation and the data order the run continues; pass the checkpoint's "
               "--seed (or start a new run in another --save folder)");
  if (!now.override_opt_param_scheduler && !now.use_checkpoint_opt_param_scheduler) {
    const std::string fix =
        "pass the checkpoint's value, or --override-opt_param-scheduler to use this run's schedule from here on, "
        "or --use-checkpoint-opt_param-scheduler to keep the checkpoint's";
    d.must_agree("--lr", now.lr, saved.lr, fix);
    d.must_agree("--lr-warmup-iters", now.lr_warmup_iters, saved.lr_warmup_iters, fix);
    if (now.lr_warmup_iters > 0 && saved.lr_warmup_iters > 0) {
      d.must_agree("--lr-warmup-style", now.lr_warmup_style, saved.lr_warmup_style, fix);
      d.must_agree("--lr-warmup-init", now.lr_warmup_init, saved.lr_warmup_init, fix);
    }
    d.must_agree("--lr-decay-style", now.lr_decay_style, saved.lr_decay_style, fix);
    if (now.lr_decay_style != "constant" && saved.lr_decay_style != "constant") {
      d.must_agree("--min-lr", now.min_lr, saved.min_lr, fix);
      d.must_agree("the decay length (--lr-decay-iters, or --train-iters without it)", decay_length(now),
                   decay_length(saved), fix);
    }
    if (beyond_iterations(now) || beyond_iterations(saved)) {
      const TrainConfig::LrLengths a = now.lr_lengths(), b = saved.lr_lengths();
      d.must_agree("the warm-up length in samples", a.warmup_samples, b.warmup_samples, fix);
      d.must_agree("the decay length in samples", a.decay_samples, b.decay_samples, fix);
      d.must_agree("the warm-up length in tokens", a.warmup_tokens, b.warmup_tokens, fix);
      d.must_agree("the decay length in tokens", a.decay_tokens, b.decay_tokens, fix);
    }
  }
  d.may_change("tensor-parallel size", now.tensor_model_parallel_size, saved.tensor_model_parallel_size);
  d.may_change("pipeline-parallel size", now.pipeline_model_parallel_size, saved.pipeline_model_parallel_size);
  d.may_change("data-parallel size", now.data_parallel_size, saved.data_parallel_size);
  d.may_change("ZeRO stage", now.zero_stage, saved.zero_stage);
  d.may_change("expert-parallel size", now.expert_model_parallel_size, saved.expert_model_parallel_size);
  d.may_change("context-parallel size", now.context_parallel_size, saved.context_parallel_size);
  d.may_change("Ulysses sequence-parallel size", now.ds_sequence_parallel_size, saved.ds_sequence_parallel_size);
  d.may_change("expert tensor-parallel size", now.expert_tensor_parallel_size, saved.expert_tensor_parallel_size);
  if (now.model.moe.enabled() && saved.model.moe.enabled()) {
    // The routing settings may change, as Megatron's resume lets them (the parameters are the same).
    const MoeConfig& a = now.model.moe;
    const MoeConfig& b = saved.model.moe;
    d.may_change("MoE top-k", a.topk, b.topk);
    d.may_change("MoE token dropping", a.drop_tokens, b.drop_tokens);
    d.may_change("MoE capacity factor", a.capacity_factor, b.capacity_factor);
    d.may_change("MoE load-balancing coefficient", a.aux_loss_coeff, b.aux_loss_coeff);
  }
  d.may_change("micro-batch size", now.micro_batch_size, saved.micro_batch_size);
  d.may_change("global batch size", now.global_batch_size, saved.global_batch_size);
  d.may_change("--train-iters", now.train_iters, saved.train_iters);
  d.may_change("--data-path", now.data_path, saved.data_path);
  d.may_change("--train-data-path", now.train_data_path, saved.train_data_path);
  d.may_change("--valid-data-path", now.valid_data_path, saved.valid_data_path);
  d.may_change("--test-data-path", now.test_data_path, saved.test_data_path);
  d.may_change("--split", now.split, saved.split);
  d.may_change("--seq-length", now.model.seq_length, saved.model.seq_length);
  d.may_change("--layernorm-epsilon", now.model.layernorm_epsilon, saved.model.layernorm_epsilon);
  d.may_change("--hidden-dropout", now.model.hidden_dropout, saved.model.hidden_dropout);
  d.may_change("--attention-dropout", now.model.attention_dropout, saved.model.attention_dropout);
  d.may_change("--weight-decay", now.weight_decay, saved.weight_decay);
  d.may_change("--clip-grad", now.clip_grad, saved.clip_grad);
  d.may_change("--adam-beta1", now.adam_beta1, saved.adam_beta1);
  d.may_change("--adam-beta2", now.adam_beta2, saved.adam_beta2);
  d.may_change("--adam-eps", now.adam_eps, saved.adam_eps);
  // Checkpoints hold fp32 master weights, so a run may resume in another precision (its loss scale
  // then starts afresh).
  d.may_change("precision", std::string(to_string(now.precision.dtype)), std::string(to_string(saved.precision.dtype)));
  if (now.override_opt_param_scheduler) {
    d.may_change("--lr", now.lr, saved.lr);
    d.may_change("--min-lr", now.min_lr, saved.min_lr);
    d.may_change("--lr-decay-style", now.lr_decay_style, saved.lr_decay_style);
    d.may_change("--lr-warmup-iters", now.lr_warmup_iters, saved.lr_warmup_iters);
    d.may_change("the decay length", decay_length(now), decay_length(saved));
  }
  return out;
}

ResumeCheck check_finetune(const TrainConfig& now, const TrainConfig& saved) {
  ResumeCheck out;
  Differences d{out};
  shapes_must_agree(d, now, saved, "the parameters' shapes follow from it; pass the checkpoint's value");
  rotary_must_agree(d, now.model, saved.model, "the parameters were trained with it; pass the checkpoint's value");
  d.may_change("--rotary-base", now.model.rotary_base, saved.model.rotary_base);
  d.must_agree("the vocabulary size (of --tokenizer-type and its files)", now.model.vocab_size, saved.model.vocab_size,
               "the embedding has one row per token: use the tokenizer (and vocabulary files) the model was trained "
               "with");
  d.may_change("--tokenizer-type", now.tokenizer_type, saved.tokenizer_type);
  d.may_change("--layernorm-epsilon", now.model.layernorm_epsilon, saved.model.layernorm_epsilon);
  return out;
}

void use_checkpoint_schedule(TrainConfig& now, const TrainConfig& saved) {
  now.lr = saved.lr;
  now.min_lr = saved.min_lr;
  now.lr_decay_style = saved.lr_decay_style;
  now.lr_warmup_iters = saved.lr_warmup_iters;
  now.lr_warmup_style = saved.lr_warmup_style;
  now.lr_warmup_init = saved.lr_warmup_init;
  now.lr_decay_iters = decay_length(saved);
  now.lr_warmup_fraction = saved.lr_warmup_fraction;
  now.lr_warmup_samples = saved.lr_warmup_samples;
  now.lr_decay_samples = saved.lr_decay_samples;
  now.lr_warmup_tokens = saved.lr_warmup_tokens;
  now.lr_decay_tokens = saved.lr_decay_tokens;
}

Status check_save_folder(const std::string& save, const std::string& run_id, const std::string& resuming_from) {
  auto latest = latest_run(save);
  if (!latest) return latest.status().with_context("--save " + save + ": ");
  if (!latest->found) return Status::ok();
  std::error_code ec;
  const bool same_folder = !resuming_from.empty() && std::filesystem::equivalent(save, resuming_from, ec);
  if (latest->run_id.empty() ? same_folder : latest->run_id == run_id) return Status::ok();
  const TrainConfig& c = latest->config;
  return Status::bad_input(
      "--save " + save + " holds the checkpoints of another run (its latest, iteration " +
      std::to_string(latest->iteration) + ", was written by a run with --seed " + std::to_string(c.seed) +
      ", --train-iters " + std::to_string(c.train_iters) + ", --lr " + text(c.lr) +
      (latest->run_id.empty() ? "" : ", run id " + latest->run_id) +
      ") -- to continue that run pass --load " + save + "; to start a new one choose an empty --save folder (or remove "
      "the old checkpoints)");
}

}  // namespace troupe
