// TrainConfig's JSON form: every field survives a round trip; bad JSON names the key at fault.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "troupe/train_config.hpp"

namespace troupe {
namespace {

using nlohmann::json;

// A file as version 8 wrote it: no context-parallel or Ulysses sizes in "parallel".
json without_long_sequences(json j) {
  if (j.contains("parallel"))
    for (const char* key : {"context_parallel_size", "cp_comm_type", "ds_sequence_parallel_size"})
      j.at("parallel").erase(key);
  return j;
}

// A file as version 7 wrote it: no mixture of experts ("model.moe", the expert sizes in "parallel").
json without_moe(json j) {
  j = without_long_sequences(j);
  j.at("model").erase("moe");
  if (j.contains("parallel"))
    for (const char* key : {"expert_model_parallel_size", "expert_tensor_parallel_size"}) j.at("parallel").erase(key);
  return j;
}

// A file as version 6 wrote it: no "precision" (nor mixture of experts).
json without_precision(json j) {
  j = without_moe(j);
  j.erase("precision");
  return j;
}

// A file as version 5 wrote it: no architecture family in "model" (nor "precision").
json without_family(json j) {
  j = without_precision(j);
  for (const char* key : {"normalization", "position_embedding_type", "activation", "add_bias_linear",
                          "untie_embeddings_and_output_weights", "embed_layernorm", "num_query_groups", "kv_channels",
                          "ffn_hidden_size", "rotary_percent", "rotary_base", "rotary_interleaved"})
    j.at("model").erase(key);
  return j;
}

// A file as version 4 wrote it: no dropout, no batch-size ramp-up (nor the family).
json without_dropout(json j) {
  j = without_family(j);
  for (const char* key : {"hidden_dropout", "attention_dropout"}) j.at("model").erase(key);
  if (j.contains("schedule"))
    for (const char* key : {"rampup_start_batch", "rampup_batch_increment", "rampup_samples"}) j.at("schedule").erase(key);
  return j;
}

// A file as versions before 4 wrote it: no per-split data paths, no "schedule" (nor dropout).
json without_data_paths(json j) {
  for (const char* key : {"train_data_path", "valid_data_path", "test_data_path", "schedule"}) j.erase(key);
  return without_dropout(j);
}

// Every field differs from its default, so a field dropped on either side fails the round trip.
TrainConfig all_fields_set() {
  TrainConfig c;
  c.model.num_layers = 7;
  c.model.hidden_size = 96;
  c.model.num_attention_heads = 3;
  c.model.seq_length = 48;
  c.model.max_position_embeddings = 64;
  c.model.vocab_size = 50257;
  c.model.make_vocab_size_divisible_by = 64;
  c.model.layernorm_epsilon = 1e-6;
  c.model.init_method_std = 0.0125;
  c.model.hidden_dropout = 0.05;
  c.model.attention_dropout = 0.2;
  c.model.normalization = Normalization::rmsnorm;
  c.model.position_embedding = PositionEmbedding::rope;
  c.model.activation = MlpActivation::swiglu;
  c.model.add_bias_linear = false;
  c.model.untie_embeddings_and_output_weights = true;
  c.model.embed_layernorm = true;
  c.model.num_query_groups = 1;
  c.model.kv_channels = 40;
  c.model.ffn_hidden = 250;
  c.model.rotary_percent = 0.625;
  c.model.rotary_base = 123456.5;
  c.model.rotary_interleaved = true;
  MoeConfig& moe = c.model.moe;  // every field off its default (validation would refuse some together)
  moe.num_experts = {4, 8, 2};
  moe.layer_freq = 3;
  moe.layer_pattern = {0, 1, 1, 0, 1, 0, 0};
  moe.router = MoeRouter::deepspeed;
  moe.topk = 1;
  moe.ffn_hidden = 64;
  moe.drop_tokens = false;
  moe.capacity_factor = -1.25;
  moe.eval_capacity_factor = 2.5;
  moe.min_capacity = 4;
  moe.drop_policy = MoeDropPolicy::position;
  moe.pad_to_capacity = true;
  moe.random_token_selection = false;
  moe.second_expert_sampling = false;
  moe.load_balancing = MoeLoadBalancing::seq_aux_loss;
  moe.pre_softmax = true;
  moe.z_loss_coeff = 1e-3;
  moe.input_jitter_eps = 0.01;
  moe.aux_loss_coeff = 0.1;
  moe.residual = true;
  moe.shared_expert_ffn = 96;
  c.expert_model_parallel_size = 2;
  c.expert_tensor_parallel_size = 3;
  c.context_parallel_size = 4;
  c.cp_comm_type = "all_gather";
  c.ds_sequence_parallel_size = 2;
  c.micro_batch_size = 3;
  c.global_batch_size = 12;
  c.tensor_model_parallel_size = 3;
  c.pipeline_model_parallel_size = 2;
  c.data_parallel_size = 4;
  c.zero_stage = 2;
  c.pipeline_schedule = "interleaved";
  c.num_layers_per_virtual_pipeline_stage = 1;
  c.recompute_granularity = "selective";
  c.sequence_parallel = true;
  c.timeline = "/logs/timeline.json";
  c.offload_optimizer = "nvme";
  c.offload_path = "/nvme/swap";
  c.max_restarts = 3;
  c.distributed_timeout_minutes = 2.5;
  c.lr = 3.3e-4;
  c.min_lr = 1.1e-5;
  c.lr_decay_style = "cosine";
  c.lr_warmup_iters = 17;
  c.lr_warmup_style = "log";
  c.lr_warmup_init = 2.5e-6;
  c.lr_decay_iters = 900;
  c.weight_decay = 0.1;
  c.adam_beta1 = 0.85;
  c.adam_beta2 = 0.95;
  c.adam_eps = 1e-6;
  c.clip_grad = 0.7;
  c.train_iters = 1234;
  c.train_samples = 98765;  // (validation rejects it beside --lr-decay-iters; the JSON keeps both)
  c.lr_warmup_samples = 31;
  c.lr_decay_samples = 5000;
  c.lr_warmup_fraction = 0.125;
  c.train_tokens = 123456789;
  c.lr_warmup_tokens = 0;
  c.lr_decay_tokens = 7777777;
  c.rampup_start_batch = 3;
  c.rampup_batch_increment = 5;
  c.rampup_samples = 424242;
  c.seed = 18446744073709551557ull;  // above INT64_MAX: the unsigned path
  c.data_path = {"0.3", "/data/web_text_document", "0.7", "/data/my books_text_document"};
  c.valid_data_path = {"/data/valid_text_document"};  // (validation rejects both; the JSON keeps both)
  c.test_data_path = {"1", "/data/t1", "2", "/data/t2"};
  c.tokenizer_type = "ByteLevelTokenizer";
  c.vocab_file = "/v/vocab.json";
  c.merge_file = "/v/merges.txt";
  c.tokenizer_model = "/v/tokenizer.model";
  c.no_shuffle = true;
  c.split = "98,2,0";
  c.save = "/ckpt/run1";
  c.save_interval = 50;
  c.load = "/ckpt/run0";
  c.eval_interval = 25;
  c.eval_iters = 5;
  c.log_interval = 2;
  c.metrics_file = "/logs/metrics.jsonl";
  c.num_threads = 6;
  c.device = "cuda";
  c.deepspeed_config = "ds_config.json";
  c.precision.dtype = PrecisionDType::fp16;
  c.precision.recipe = PrecisionRecipe::deepspeed;
  c.precision.loss_scale = 0.125;
  c.precision.initial_loss_scale = 65536.5;
  c.precision.min_loss_scale = 0.25;
  c.precision.loss_scale_window = 333;
  c.precision.hysteresis = 5;
  c.precision.consecutive_hysteresis = true;
  c.precision.accumulate_allreduce_grads_in_fp32 = true;
  c.precision.attention_softmax_in_fp32 = true;
  c.precision.bf16_immediate_grad_update = true;
  c.precision.bf16_check_grad_overflow = true;
  c.precision.communication_data_type = "bf16";
  return c;
}

void require_equal(const TrainConfig& a, const TrainConfig& b) {
  CHECK(a.model.num_layers == b.model.num_layers);
  CHECK(a.model.hidden_size == b.model.hidden_size);
  CHECK(a.model.num_attention_heads == b.model.num_attention_heads);
  CHECK(a.model.seq_length == b.model.seq_length);
  CHECK(a.model.max_position_embeddings == b.model.max_position_embeddings);
  CHECK(a.model.vocab_size == b.model.vocab_size);
  CHECK(a.model.make_vocab_size_divisible_by == b.model.make_vocab_size_divisible_by);
  CHECK(a.model.layernorm_epsilon == b.model.layernorm_epsilon);  // exact: shortest round-trip form
  CHECK(a.model.init_method_std == b.model.init_method_std);
  CHECK(a.model.hidden_dropout == b.model.hidden_dropout);
  CHECK(a.model.attention_dropout == b.model.attention_dropout);
  CHECK(a.model.normalization == b.model.normalization);
  CHECK(a.model.position_embedding == b.model.position_embedding);
  CHECK(a.model.activation == b.model.activation);
  CHECK(a.model.add_bias_linear == b.model.add_bias_linear);
  CHECK(a.model.untie_embeddings_and_output_weights == b.model.untie_embeddings_and_output_weights);
  CHECK(a.model.embed_layernorm == b.model.embed_layernorm);
  CHECK(a.model.num_query_groups == b.model.num_query_groups);
  CHECK(a.model.kv_channels == b.model.kv_channels);
  CHECK(a.model.ffn_hidden == b.model.ffn_hidden);
  CHECK(a.model.rotary_percent == b.model.rotary_percent);
  CHECK(a.model.rotary_base == b.model.rotary_base);
  CHECK(a.model.rotary_interleaved == b.model.rotary_interleaved);
  CHECK(a.model.moe == b.model.moe);
  CHECK(a.expert_model_parallel_size == b.expert_model_parallel_size);
  CHECK(a.expert_tensor_parallel_size == b.expert_tensor_parallel_size);
  CHECK(a.micro_batch_size == b.micro_batch_size);
  CHECK(a.global_batch_size == b.global_batch_size);
  CHECK(a.tensor_model_parallel_size == b.tensor_model_parallel_size);
  CHECK(a.pipeline_model_parallel_size == b.pipeline_model_parallel_size);
  CHECK(a.data_parallel_size == b.data_parallel_size);
  CHECK(a.zero_stage == b.zero_stage);
  CHECK(a.pipeline_schedule == b.pipeline_schedule);
  CHECK(a.num_layers_per_virtual_pipeline_stage == b.num_layers_per_virtual_pipeline_stage);
  CHECK(a.recompute_granularity == b.recompute_granularity);
  CHECK(a.sequence_parallel == b.sequence_parallel);
  CHECK(a.timeline == b.timeline);
  CHECK(a.lr == b.lr);
  CHECK(a.min_lr == b.min_lr);
  CHECK(a.lr_decay_style == b.lr_decay_style);
  CHECK(a.lr_warmup_iters == b.lr_warmup_iters);
  CHECK(a.lr_warmup_style == b.lr_warmup_style);
  CHECK(a.lr_warmup_init == b.lr_warmup_init);
  CHECK(a.lr_decay_iters == b.lr_decay_iters);
  CHECK(a.weight_decay == b.weight_decay);
  CHECK(a.adam_beta1 == b.adam_beta1);
  CHECK(a.adam_beta2 == b.adam_beta2);
  CHECK(a.adam_eps == b.adam_eps);
  CHECK(a.clip_grad == b.clip_grad);
  CHECK(a.train_iters == b.train_iters);
  CHECK(a.train_samples == b.train_samples);
  CHECK(a.lr_warmup_samples == b.lr_warmup_samples);
  CHECK(a.lr_decay_samples == b.lr_decay_samples);
  CHECK(a.lr_warmup_fraction == b.lr_warmup_fraction);
  CHECK(a.train_tokens == b.train_tokens);
  CHECK(a.lr_warmup_tokens == b.lr_warmup_tokens);
  CHECK(a.lr_decay_tokens == b.lr_decay_tokens);
  CHECK(a.rampup_start_batch == b.rampup_start_batch);
  CHECK(a.rampup_batch_increment == b.rampup_batch_increment);
  CHECK(a.rampup_samples == b.rampup_samples);
  CHECK(a.seed == b.seed);
  CHECK(a.data_path == b.data_path);
  CHECK(a.train_data_path == b.train_data_path);
  CHECK(a.valid_data_path == b.valid_data_path);
  CHECK(a.test_data_path == b.test_data_path);
  CHECK(a.tokenizer_type == b.tokenizer_type);
  CHECK(a.vocab_file == b.vocab_file);
  CHECK(a.merge_file == b.merge_file);
  CHECK(a.tokenizer_model == b.tokenizer_model);
  CHECK(a.no_shuffle == b.no_shuffle);
  CHECK(a.split == b.split);
  CHECK(a.save == b.save);
  CHECK(a.save_interval == b.save_interval);
  CHECK(a.load == b.load);
  CHECK(a.eval_interval == b.eval_interval);
  CHECK(a.eval_iters == b.eval_iters);
  CHECK(a.log_interval == b.log_interval);
  CHECK(a.metrics_file == b.metrics_file);
  CHECK(a.num_threads == b.num_threads);
  CHECK(a.device == b.device);
  CHECK(a.deepspeed_config == b.deepspeed_config);
  CHECK(a.precision == b.precision);
}

// Parses `c.to_json()`, lets `edit` damage it, and returns from_json's error message.
template <class Edit>
std::string error_after(Edit edit) {
  json j = json::parse(all_fields_set().to_json());
  edit(j);
  auto r = TrainConfig::from_json(j.dump());
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

TEST_CASE("train config: JSON round trip keeps every field", "[train_config]") {
  const TrainConfig original = all_fields_set();
  auto parsed = TrainConfig::from_json(original.to_json());
  REQUIRE(parsed.is_ok());
  require_equal(parsed.value(), original);
  CHECK(parsed.value().to_json() == original.to_json());

  // The defaults too (empty strings, zeros, false).
  auto defaults = TrainConfig::from_json(TrainConfig{}.to_json());
  REQUIRE(defaults.is_ok());
  require_equal(defaults.value(), TrainConfig{});
}

TEST_CASE("train config: the model sits under \"model\" with Megatron's names", "[train_config]") {
  const json j = json::parse(all_fields_set().to_json());
  REQUIRE(j.at("model").is_object());
  const json& m = j.at("model");
  CHECK(m.at("num_layers") == 7);
  CHECK(m.at("hidden_size") == 96);
  CHECK(m.at("num_attention_heads") == 3);
  CHECK(m.at("seq_length") == 48);
  CHECK(m.at("max_position_embeddings") == 64);
  CHECK(m.at("vocab_size") == 50257);
  CHECK(m.at("make_vocab_size_divisible_by") == 64);
  CHECK(m.at("layernorm_epsilon") == 1e-6);
  CHECK(m.at("init_method_std") == 0.0125);
  CHECK(m.at("hidden_dropout") == 0.05);
  CHECK(m.at("attention_dropout") == 0.2);
  CHECK(m.at("normalization") == "RMSNorm");
  CHECK(m.at("position_embedding_type") == "rope");
  CHECK(m.at("activation") == "swiglu");
  CHECK(m.at("num_query_groups") == 1);
  CHECK(m.at("ffn_hidden_size") == 250);
  CHECK(m.size() == 24);  // with "moe"
  CHECK(j.at("lr") == 3.3e-4);
  CHECK(j.at("format") == "troupe.train_config");
  CHECK(j.at("version") == 9);
}

TEST_CASE("train config: a version 4 file (no dropout) loads with dropout 0, as it trained", "[train_config]") {
  json j = without_dropout(json::parse(all_fields_set().to_json()));
  j["version"] = 4;
  auto r = TrainConfig::from_json(j.dump());
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  CHECK(r.value().model.hidden_dropout == 0);
  CHECK(r.value().model.attention_dropout == 0);
  CHECK(!r.value().rampup());
  CHECK(r.value().model.num_layers == 7);
  CHECK(json::parse(r.value().to_json()).at("version") == 9);
  CHECK(r.value().model.is_gpt2_family());
  // Version 4 never had dropout: a key of it there is unknown; version 5 needs both.
  json with = without_family(json::parse(all_fields_set().to_json()));
  with["version"] = 4;
  auto bad = TrainConfig::from_json(with.dump());
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown key \"model.attention_dropout\""));
  CHECK_THAT(error_after([](json& e) { e.at("model").erase("attention_dropout"); }),
             Catch::Contains("missing key \"model.attention_dropout\""));
  CHECK_THAT(error_after([](json& e) { e["model"]["hidden_dropout"] = 1.5; }),
             Catch::Contains("\"model.hidden_dropout\""));
}

TEST_CASE("train config: offload and restarts sit under \"runtime\" (version 3)", "[train_config]") {
  const json j = json::parse(all_fields_set().to_json());
  const json& r = j.at("runtime");
  CHECK(r.at("offload_optimizer") == "nvme");
  CHECK(r.at("offload_path") == "/nvme/swap");
  CHECK(r.at("max_restarts") == 3);
  CHECK(r.at("distributed_timeout_minutes") == 2.5);
  CHECK(r.size() == 4);
  auto back = TrainConfig::from_json(j.dump());
  REQUIRE(back.is_ok());
  CHECK(back.value().offload_optimizer == "nvme");
  CHECK(back.value().offload_path == "/nvme/swap");
  CHECK(back.value().max_restarts == 3);
  // A version 2 file has no "runtime": no offload, no restarts.
  json v2 = without_data_paths(j);
  v2.erase("runtime");
  v2["version"] = 2;
  auto old = TrainConfig::from_json(v2.dump());
  INFO(old.status().message());
  REQUIRE(old.is_ok());
  CHECK(old.value().offload_optimizer == "none");
  CHECK(old.value().offload_path.empty());
  CHECK(old.value().max_restarts == 0);
  CHECK(old.value().distributed_timeout_minutes == 10);
  CHECK(old.value().tensor_model_parallel_size == 3);
  json v2_with = without_data_paths(j);
  v2_with["version"] = 2;
  auto bad = TrainConfig::from_json(v2_with.dump());
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown key \"runtime\""));
}

TEST_CASE("train config: parallelism sits under \"parallel\"", "[train_config]") {
  const json j = json::parse(all_fields_set().to_json());
  REQUIRE(j.at("parallel").is_object());
  const json& p = j.at("parallel");
  CHECK(p.at("tensor_model_parallel_size") == 3);
  CHECK(p.at("pipeline_model_parallel_size") == 2);
  CHECK(p.at("data_parallel_size") == 4);
  CHECK(p.at("zero_stage") == 2);
  CHECK(p.at("pipeline_schedule") == "interleaved");
  CHECK(p.at("num_layers_per_virtual_pipeline_stage") == 1);
  CHECK(p.at("recompute_granularity") == "selective");
  CHECK(p.at("sequence_parallel") == true);
  CHECK(p.at("timeline") == "/logs/timeline.json");
  CHECK(p.at("expert_model_parallel_size") == 2);
  CHECK(p.at("expert_tensor_parallel_size") == 3);
  CHECK(p.at("context_parallel_size") == 4);
  CHECK(p.at("cp_comm_type") == "all_gather");
  CHECK(p.at("ds_sequence_parallel_size") == 2);
  CHECK(p.size() == 14);
  CHECK_FALSE(j.contains("zero_stage"));  // not duplicated at the top level

  // The defaults: 1 x 1 x derived, no ZeRO, 1F1B, no recomputation.
  const json d = json::parse(TrainConfig{}.to_json()).at("parallel");
  CHECK(d.at("tensor_model_parallel_size") == 1);
  CHECK(d.at("pipeline_model_parallel_size") == 1);
  CHECK(d.at("data_parallel_size") == 0);
  CHECK(d.at("zero_stage") == 0);
  CHECK(d.at("pipeline_schedule") == "1f1b");
  CHECK(d.at("recompute_granularity") == "none");
  CHECK(d.at("sequence_parallel") == false);
}

TEST_CASE("train config: a version 3 file (data_path a string, no per-split paths) loads", "[train_config]") {
  json j = without_data_paths(json::parse(all_fields_set().to_json()));
  j["version"] = 3;
  j["data_path"] = "/data/web_text_document";
  auto r = TrainConfig::from_json(j.dump());
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  CHECK(r.value().data_path == std::vector<std::string>{"/data/web_text_document"});
  CHECK(r.value().train_data_path.empty());
  j["data_path"] = "";
  r = TrainConfig::from_json(j.dump());
  REQUIRE(r.is_ok());
  CHECK(r.value().data_path.empty());
  // Version 3 never had the per-split paths: one there is unknown.
  j["valid_data_path"] = json::array({"v"});
  r = TrainConfig::from_json(j.dump());
  REQUIRE_FALSE(r.is_ok());
  CHECK_THAT(r.status().message(), Catch::Contains("unknown key \"valid_data_path\""));
}

TEST_CASE("train config: a version 1 file (no \"parallel\") loads as one shard", "[train_config]") {
  json j = without_data_paths(json::parse(all_fields_set().to_json()));
  j.erase("parallel");
  j.erase("runtime");
  j["version"] = 1;
  auto r = TrainConfig::from_json(j.dump());
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  const TrainConfig& c = r.value();
  const TrainConfig defaults;
  CHECK(c.tensor_model_parallel_size == 1);
  CHECK(c.pipeline_model_parallel_size == 1);
  CHECK(c.data_parallel_size == defaults.data_parallel_size);
  CHECK(c.resolved_dp() == 1);
  CHECK(c.zero_stage == 0);
  CHECK(c.pipeline_schedule == defaults.pipeline_schedule);
  CHECK(c.num_layers_per_virtual_pipeline_stage == 0);
  CHECK(c.recompute_granularity == "none");
  CHECK_FALSE(c.sequence_parallel);
  CHECK(c.timeline.empty());
  CHECK_FALSE(c.parallel());
  // Everything else still comes from the file.
  CHECK(c.model.num_layers == 7);
  CHECK(c.micro_batch_size == 3);
  CHECK(c.lr == 3.3e-4);
  // Written again, it is version 5.
  CHECK(json::parse(c.to_json()).at("version") == 9);

  // Version 1 never had "parallel": one there is unknown.
  json with_parallel = without_data_paths(json::parse(all_fields_set().to_json()));
  with_parallel.erase("runtime");
  with_parallel["version"] = 1;
  auto bad = TrainConfig::from_json(with_parallel.dump());
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown key \"parallel\""));
}

TEST_CASE("train config: data-parallel size and accumulation steps per world size",
          "[train_config]") {
  TrainConfig c;
  c.micro_batch_size = 2;
  c.global_batch_size = 32;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  CHECK(c.resolved_dp() == 1);   // one process: 1 replica unless --data-parallel-size says more
  CHECK(c.resolved_dp(8) == 2);  // 8 ranks / (2 x 2)
  CHECK(c.grad_accumulation_steps() == 16);
  CHECK(c.grad_accumulation_steps(8) == 8);
  c.data_parallel_size = 4;
  CHECK(c.resolved_dp() == 4);
  CHECK(c.resolved_dp(8) == 4);  // explicit: validate_world reports the mismatch
  CHECK(c.grad_accumulation_steps() == 4);
  CHECK(c.parallel());
  TrainConfig z;
  CHECK_FALSE(z.parallel());
  z.zero_stage = 1;
  CHECK(z.parallel());
}

TEST_CASE("train config: from_json names the missing or mistyped key", "[train_config]") {
  CHECK_THAT(error_after([](json& j) { j.erase("lr"); }), Catch::Contains("missing key \"lr\""));
  CHECK_THAT(error_after([](json& j) { j["model"].erase("hidden_size"); }),
             Catch::Contains("missing key \"model.hidden_size\""));
  CHECK_THAT(error_after([](json& j) { j.erase("model"); }), Catch::Contains("\"model\""));
  CHECK_THAT(error_after([](json& j) { j["model"] = 3; }),
             Catch::Contains("\"model\" must be an object"));
  CHECK_THAT(error_after([](json& j) { j["lr"] = "fast"; }),
             Catch::Contains("\"lr\" must be a number") && Catch::Contains("\"fast\""));
  CHECK_THAT(error_after([](json& j) { j["micro_batch_size"] = 4.5; }),
             Catch::Contains("\"micro_batch_size\" must be an integer"));
  CHECK_THAT(error_after([](json& j) { j["model"]["num_layers"] = 1LL << 40; }),
             Catch::Contains("\"model.num_layers\" must be an integer in [1, 2147483647]"));
  CHECK_THAT(error_after([](json& j) { j["seed"] = -1; }),
             Catch::Contains("\"seed\" must be an integer in [0, 18446744073709551615]"));
  CHECK_THAT(error_after([](json& j) { j["no_shuffle"] = 1; }),
             Catch::Contains("\"no_shuffle\" must be true or false"));
  CHECK_THAT(error_after([](json& j) {
               j["split"] = json::array({969, 30, 1});
             }),
             Catch::Contains("\"split\" must be a string"));
  CHECK_THAT(error_after([](json& j) { j["model"]["dropout"] = 0.1; }),
             Catch::Contains("unknown key \"model.dropout\""));
  CHECK_THAT(error_after([](json& j) { j["lr_sched"] = "x"; }),
             Catch::Contains("unknown key \"lr_sched\""));
  CHECK_THAT(error_after([](json& j) { j["version"] = 10; }),
             Catch::Contains("\"version\" must be 1 to 9") && Catch::Contains("got 10"));
  CHECK_THAT(error_after([](json& j) { j["version"] = 0; }),
             Catch::Contains("\"version\" must be 1 to 9"));
  CHECK_THAT(error_after([](json& j) { j["model"]["position_embedding_type"] = "sinusoidal"; }),
             Catch::Contains("\"model.position_embedding_type\" must be \"learned_absolute\""));
  CHECK_THAT(error_after([](json& j) { j["model"].erase("rotary_base"); }),
             Catch::Contains("missing key \"model.rotary_base\""));
  CHECK_THAT(error_after([](json& j) { j["data_path"] = json::array({"a", 3}); }),
             Catch::Contains("\"data_path\" must be an array of strings"));
  CHECK_THAT(error_after([](json& j) { j.erase("valid_data_path"); }),
             Catch::Contains("missing key \"valid_data_path\""));
  CHECK_THAT(error_after([](json& j) { j["runtime"]["max_restarts"] = "two"; }),
             Catch::Contains("\"runtime.max_restarts\" must be an integer"));
  CHECK_THAT(error_after([](json& j) { j.erase("runtime"); }), Catch::Contains("missing key \"runtime\""));
  CHECK_THAT(error_after([](json& j) { j.erase("parallel"); }),
             Catch::Contains("missing key \"parallel\""));
  CHECK_THAT(error_after([](json& j) { j["parallel"] = 4; }),
             Catch::Contains("\"parallel\" must be an object"));
  CHECK_THAT(error_after([](json& j) { j["parallel"]["tensor_parallel_size"] = 2; }),
             Catch::Contains("unknown key \"parallel.tensor_parallel_size\""));
  CHECK_THAT(error_after([](json& j) { j["parallel"]["context_parallel_size"] = 0; }),
             Catch::Contains("\"parallel.context_parallel_size\""));
  CHECK_THAT(error_after([](json& j) { j["parallel"].erase("cp_comm_type"); }),
             Catch::Contains("missing key \"parallel.cp_comm_type\""));
  // A version 8 file has no long-sequence keys: cp 1, p2p, Ulysses 1; one there is unknown.
  {
    json old = without_long_sequences(json::parse(all_fields_set().to_json()));
    old["version"] = 8;
    auto r = TrainConfig::from_json(old.dump());
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    CHECK(r.value().context_parallel_size == 1);
    CHECK(r.value().cp_comm_type == "p2p");
    CHECK(r.value().ds_sequence_parallel_size == 1);
    old["parallel"]["context_parallel_size"] = 2;
    CHECK_THAT(TrainConfig::from_json(old.dump()).status().message(),
               Catch::Contains("unknown key \"parallel.context_parallel_size\""));
  }
  CHECK_THAT(error_after([](json& j) { j["parallel"].erase("zero_stage"); }),
             Catch::Contains("missing key \"parallel.zero_stage\""));
  CHECK_THAT(error_after([](json& j) { j["parallel"]["sequence_parallel"] = "yes"; }),
             Catch::Contains("\"parallel.sequence_parallel\" must be true or false"));
  CHECK_THAT(error_after([](json& j) { j["parallel"]["tensor_model_parallel_size"] = 1.5; }),
             Catch::Contains("\"parallel.tensor_model_parallel_size\" must be an integer"));
  CHECK_THAT(error_after([](json& j) { j["zero_stage"] = 1; }),  // at the top level: unknown
             Catch::Contains("unknown key \"zero_stage\""));
  CHECK_THAT(error_after([](json& j) { j.erase("format"); }), Catch::Contains("\"format\""));

  auto malformed = TrainConfig::from_json("{\"lr\": 1e-3,");
  REQUIRE_FALSE(malformed.is_ok());
  CHECK_THAT(malformed.status().message(), Catch::Contains("is not valid JSON") &&
                                               Catch::Contains("line 1") &&
                                               Catch::Contains("damaged"));
  auto not_object = TrainConfig::from_json("[1, 2]");
  REQUIRE_FALSE(not_object.is_ok());
  CHECK_THAT(not_object.status().message(), Catch::Contains("must be an object"));
}

// What a damaged or hostile checkpoint config may hold: numbers a double cannot hold, integers
// wider than their field, negative sizes. Each is a message naming the key and the range, never an
// exception (issue 10: 1e400 ended in std::terminate) nor a silently narrowed value.
TEST_CASE("train config: out-of-range numbers name the key and the allowed range",
          "[train_config]") {
  const std::string text = all_fields_set().to_json();
  const auto with = [&](const std::string& key, const std::string& value) {
    std::string t = text;
    const size_t at = t.find("\"" + key + "\": ");
    REQUIRE(at != std::string::npos);
    const size_t begin = at + key.size() + 4, end = t.find_first_of(",\n", begin);
    t.replace(begin, end - begin, value);
    auto r = TrainConfig::from_json(t);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().is_bad_input());  // a damaged checkpoint: exit 2
    return r.status().message();
  };
  CHECK_THAT(with("lr", "1e400"), Catch::Contains("key \"lr\"") && Catch::Contains("1e400") &&
                                      Catch::Contains("range of a double"));
  CHECK_THAT(with("train_iters", "10000000000000000000"),
             Catch::Contains("\"train_iters\" must be an integer in [0, 9223372036854775807]") &&
                 Catch::Contains("got 10000000000000000000"));
  CHECK_THAT(with("num_layers", "-1"),
             Catch::Contains("\"model.num_layers\" must be an integer in [1, 2147483647], got -1"));
  CHECK_THAT(with("micro_batch_size", "3000000000"),
             Catch::Contains("\"micro_batch_size\" must be an integer in [1, 2147483647]"));
  CHECK_THAT(with("vocab_size", "4294967303"),
             Catch::Contains("\"model.vocab_size\" must be an integer in [0, 2147483647]"));
  CHECK_THAT(with("zero_stage", "4"),
             Catch::Contains("\"parallel.zero_stage\" must be an integer in [0, 3]"));
  CHECK_THAT(with("adam_beta2", "1.5"),
             Catch::Contains("\"adam_beta2\" must be a number in [0, 1], got 1.5"));
  CHECK_THAT(with("weight_decay", "-0.1"),
             Catch::Contains("\"weight_decay\" must be a number in [0, "));
  CHECK_THAT(with("distributed_timeout_minutes", "-1e308"),
             Catch::Contains("\"runtime.distributed_timeout_minutes\" must be a number"));
  // Nesting that would overflow the stack when printed.
  auto deep = TrainConfig::from_json(std::string(20000, '[') + std::string(20000, ']'));
  REQUIRE_FALSE(deep.is_ok());
  CHECK_THAT(deep.status().message(), Catch::Contains("nested deeper than"));
}

}  // namespace
}  // namespace troupe

namespace troupe {
// Megatron's ramp-up (num_microbatches_calculator.py), one iteration at a time: what
// TrainConfig::samples_after computes in bulk between the increments' boundaries.
TEST_CASE("train config: the batch-size ramp-up's samples, in bulk and one iteration at a time", "[train_config]") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    TrainConfig c;
    c.rampup_start_batch = 1 + static_cast<int64_t>(rng() % 40);
    c.rampup_batch_increment = 1 + static_cast<int64_t>(rng() % 9);
    c.global_batch_size =
        static_cast<int>(c.rampup_start_batch + c.rampup_batch_increment * static_cast<int64_t>(rng() % 30));
    c.rampup_samples = static_cast<int64_t>(rng() % 20000);
    const int64_t increments = (c.global_batch_size - c.rampup_start_batch) / c.rampup_batch_increment;
    const double per = increments > 0 ? static_cast<double>(c.rampup_samples) / static_cast<double>(increments) : 0;
    auto megatron_batch = [&](int64_t consumed) -> int64_t {
      if (increments == 0 || consumed > c.rampup_samples) return c.global_batch_size;
      return c.rampup_start_batch + static_cast<int64_t>(static_cast<double>(consumed) / per) * c.rampup_batch_increment;
    };
    int64_t consumed = 0;
    for (int64_t k = 0; k <= 3000; ++k) {
      if (k % 7 == 0 || k < 50) {
        INFO("trial " << trial << " iteration " << k);
        REQUIRE(c.samples_after(k) == consumed);
      }
      REQUIRE(c.global_batch_at(consumed) == megatron_batch(consumed));
      consumed += megatron_batch(consumed);
    }
  }
  TrainConfig none;
  none.global_batch_size = 24;
  CHECK(none.samples_after(1000) == 24000);
  CHECK(none.global_batch_at(77) == 24);
}
}  // namespace troupe

namespace {
// A key older files lack: `set` gives it a value other than the default (written as `written`);
// the file without it loads with the default (`is_default`), and a value of the wrong type is
// refused naming the key.
template <class Set, class IsDefault>
void check_key_older_files_lack(const char* key, const nlohmann::json& written, Set set, IsDefault is_default) {
  troupe::TrainConfig c;
  set(c);
  auto j = nlohmann::json::parse(c.to_json());
  REQUIRE(j.at(key) == written);
  j.erase(key);
  auto back = troupe::TrainConfig::from_json(j.dump());
  REQUIRE(back.is_ok());
  CHECK(is_default(*back));
  j[key] = 3;
  auto bad = troupe::TrainConfig::from_json(j.dump());
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains(key));
}
}  // namespace

TEST_CASE("train config: a file without tokenizer_model (before the model families) loads with none", "[train_config]") {
  check_key_older_files_lack(
      "tokenizer_model", "/m/tokenizer.json", [](troupe::TrainConfig& c) { c.tokenizer_model = "/m/tokenizer.json"; },
      [](const troupe::TrainConfig& c) { return c.tokenizer_model.empty(); });
}

TEST_CASE("train config: a file without device (before the GPU backend) loads as cpu", "[train_config]") {
  check_key_older_files_lack(
      "device", "cuda", [](troupe::TrainConfig& c) { c.device = "cuda"; },
      [](const troupe::TrainConfig& c) { return c.device == "cpu"; });
}

namespace troupe {
namespace {

TEST_CASE("train config: the precision sits under \"precision\" (version 7); older files read as fp32",
          "[train_config]") {
  const TrainConfig c = all_fields_set();
  const json j = json::parse(c.to_json());
  const json& p = j.at("precision");
  CHECK(p.at("dtype") == "fp16");
  CHECK(p.at("recipe") == "deepspeed");
  CHECK(p.at("initial_loss_scale") == 65536.5);
  CHECK(p.at("hysteresis") == 5);
  CHECK(p.at("communication_data_type") == "bf16");
  CHECK(p.size() == 13);
  // A version 6 (or 5) file has no "precision": fp32 with Megatron's defaults, as troupe trained then.
  for (int version : {6, 5}) {
    json old = version == 6 ? without_precision(j) : without_family(j);
    old["version"] = version;
    auto r = TrainConfig::from_json(old.dump());
    INFO(version << ": " << r.status().message());
    REQUIRE(r.is_ok());
    CHECK(r.value().precision == PrecisionConfig{});
    CHECK(r.value().precision.dtype == PrecisionDType::fp32);
    CHECK(r.value().micro_batch_size == c.micro_batch_size);
    CHECK(json::parse(r.value().to_json()).at("version") == 9);
  }
  // Version 6 never had it: there it is unknown; version 7 needs it, whole.
  json extra = without_moe(j);
  extra["version"] = 6;
  auto bad = TrainConfig::from_json(extra.dump());
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("unknown key \"precision\""));
  CHECK_THAT(error_after([](json& e) { e.erase("precision"); }), Catch::Contains("missing key \"precision\""));
  CHECK_THAT(error_after([](json& e) { e["precision"].erase("hysteresis"); }),
             Catch::Contains("missing key \"precision.hysteresis\""));
  CHECK_THAT(error_after([](json& e) { e["precision"]["dtype"] = "fp8"; }),
             Catch::Contains("\"precision.dtype\" must be \"fp32\", \"bf16\" or \"fp16\""));
  CHECK_THAT(error_after([](json& e) { e["precision"]["recipe"] = "apex"; }),
             Catch::Contains("\"precision.recipe\" must be \"megatron\" or \"deepspeed\""));
  CHECK_THAT(error_after([](json& e) { e["precision"]["hysteresis"] = 0; }),
             Catch::Contains("\"precision.hysteresis\""));
  CHECK_THAT(error_after([](json& e) { e["precision"]["min_loss_scale"] = 0; }),
             Catch::Contains("\"precision.min_loss_scale\""));
  CHECK_THAT(error_after([](json& e) { e["precision"]["communication_data_type"] = "int8"; }),
             Catch::Contains("\"precision.communication_data_type\""));
  CHECK_THAT(error_after([](json& e) { e["precision"]["loss_scale_factor"] = 2; }),
             Catch::Contains("unknown key \"precision.loss_scale_factor\""));
}

TEST_CASE("train config: the gradient types of each recipe", "[train_config]") {
  using D = PrecisionDType;
  PrecisionConfig m;  // Megatron: bf16 always fp32; fp16 fp16 unless asked; fp32 fp32
  for (int stage = 0; stage <= 3; ++stage) {
    m.dtype = D::bf16;
    CHECK(m.grad_dtype(stage) == D::fp32);
    CHECK(m.grad_reduce_dtype(stage) == D::fp32);
    m.dtype = D::fp16;
    m.accumulate_allreduce_grads_in_fp32 = false;
    CHECK(m.grad_dtype(stage) == D::fp16);
    CHECK(m.grad_reduce_dtype(stage) == D::fp16);
    m.accumulate_allreduce_grads_in_fp32 = true;
    CHECK(m.grad_dtype(stage) == D::fp32);
    CHECK(m.grad_reduce_dtype(stage) == D::fp32);
    m.communication_data_type = "bf16";  // DeepSpeed's key: not Megatron's
    CHECK(m.grad_reduce_dtype(stage) == D::fp32);
    m.communication_data_type.clear();
    m.dtype = D::fp32;
    CHECK(m.grad_dtype(stage) == D::fp32);
  }
  PrecisionConfig d;  // DeepSpeed's get_data_types / communication_data_type
  d.recipe = PrecisionRecipe::deepspeed;
  d.dtype = D::bf16;
  CHECK(d.grad_dtype(0) == D::fp32);  // the BF16_Optimizer
  CHECK(d.grad_reduce_dtype(0) == D::bf16);
  CHECK(d.grad_dtype(2) == D::bf16);  // ZeRO: the model's type
  d.dtype = D::fp16;
  d.accumulate_allreduce_grads_in_fp32 = true;  // Megatron's flag: not DeepSpeed's rule
  CHECK(d.grad_dtype(0) == D::fp16);
  CHECK(d.grad_reduce_dtype(1) == D::fp16);
  d.communication_data_type = "fp32";
  CHECK(d.grad_reduce_dtype(1) == D::fp32);
  d.dtype = D::fp32;
  d.communication_data_type.clear();
  CHECK(d.grad_dtype(3) == D::fp32);
  CHECK(d.grad_reduce_dtype(3) == D::fp32);
}

}  // namespace
}  // namespace troupe
