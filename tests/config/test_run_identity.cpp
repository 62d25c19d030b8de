// Run identity and Megatron's resume rules (config/run_identity.hpp): what must agree, what may
// change, and which --save folders a run may write into.
#include <filesystem>
#include <set>

#include <catch2/catch.hpp>

#include "config/imported_config.hpp"
#include "config/run_identity.hpp"
#include "storage/shard_file.hpp"
#include "storage/sharded_checkpoint.hpp"

using namespace troupe;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

TrainConfig base_config() {
  TrainConfig c;
  c.model.num_layers = 3;
  c.model.hidden_size = 48;
  c.model.num_attention_heads = 3;
  c.model.seq_length = 17;
  c.model.max_position_embeddings = 17;
  c.model.vocab_size = 257;
  c.tokenizer_type = "ByteLevelTokenizer";
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.lr_decay_style = "cosine";
  c.lr_warmup_iters = 3;
  c.train_iters = 40;
  c.seed = 7;
  c.data_path = {"a_text_document"};
  return c;
}

// Whether some refusal names `flag`.
bool refuses(const ResumeCheck& r, const std::string& flag) {
  for (const auto& line : r.refused)
    if (line.rfind(flag + " ", 0) == 0) return true;
  return false;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/troupe-run-id.XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A checkpoint directory with one small shard and the metadata latest_run reads: config and run id.
void write_checkpoint(const fs::path& dir, int64_t iteration, const TrainConfig& cfg, const std::string& run_id) {
  REQUIRE(prepare_iteration_dir(dir.string(), iteration).is_ok());
  ShardContents contents;
  TensorPiece piece;
  piece.name = "x";
  piece.global_shape = Shape{3};
  piece.runs = {{0, 3}};
  piece.values = Tensor::zeros(Shape{3});
  contents.sections[ShardSection::model].push_back(std::move(piece));
  REQUIRE(write_shard_file(shard_file_path(dir.string(), iteration, 0), 0, contents).is_ok());
  CheckpointMeta meta;
  meta.iteration = iteration;
  meta.config_json = cfg.to_json();
  meta.rng_json = "{}";
  if (!run_id.empty()) meta.run_json = run_json(run_id);
  REQUIRE(commit_sharded_checkpoint(dir.string(), meta, "{}", shard_file_names(1)).is_ok());
}

}  // namespace

TEST_CASE("run ids are 32 hex digits and differ", "[actors][run]") {
  std::set<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    const std::string id = new_run_id();
    REQUIRE(id.size() == 32);
    REQUIRE(id.find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(id);
  }
  REQUIRE(seen.size() == 50);
  CheckpointMeta meta;
  REQUIRE(run_id_of(meta).empty());
  meta.run_json = run_json("00ff");
  REQUIRE(run_id_of(meta) == "00ff");
  meta.run_json = "[1, 2]";  // not an object: no id
  REQUIRE(run_id_of(meta).empty());
}

TEST_CASE("resume refuses every change of shape, vocabulary, seed and schedule at once", "[actors][run]") {
  const TrainConfig saved = base_config();
  REQUIRE(check_resume(saved, saved).refused.empty());
  REQUIRE(check_resume(saved, saved).changed.empty());
  REQUIRE(check_resume(saved, saved).status("ck").is_ok());

  TrainConfig now = saved;
  now.model.num_layers = 4;
  now.model.hidden_size = 60;
  now.seed = 8;
  now.lr = 1e-3;
  const ResumeCheck r = check_resume(now, saved);
  REQUIRE(r.refused.size() == 4);
  for (const char* flag : {"--num-layers", "--hidden-size", "--seed", "--lr"}) REQUIRE(refuses(r, flag));
  const Status st = r.status("ck");
  REQUIRE(st.is_bad_input());
  for (const char* text : {"--num-layers is 4 but the checkpoint's run used 3", "--seed is 8", "--override-opt_param-scheduler",
                           "--use-checkpoint-opt_param-scheduler"})
    REQUIRE(st.message().find(text) != std::string::npos);

  TrainConfig vocab = saved;
  vocab.model.vocab_size = 50257;
  REQUIRE(refuses(check_resume(vocab, saved), "the vocabulary size"));
  TrainConfig tok = saved;
  tok.tokenizer_type = "GPT2BPETokenizer";
  REQUIRE(refuses(check_resume(tok, saved), "--tokenizer-type"));
}

TEST_CASE("the schedule is compared only where the learning rate depends on it", "[actors][run]") {
  TrainConfig saved = base_config();
  // A longer run changes the decay length of a decaying schedule (Megatron refuses it too).
  TrainConfig longer = saved;
  longer.train_iters = 80;
  REQUIRE(refuses(check_resume(longer, saved), "the decay length (--lr-decay-iters, or --train-iters without it)"));
  // ... but not when --lr-decay-iters pins the decay length.
  saved.lr_decay_iters = 40;
  longer.lr_decay_iters = 40;
  ResumeCheck pinned = check_resume(longer, saved);
  REQUIRE(pinned.refused.empty());
  REQUIRE(pinned.changed == std::vector<std::string>{"--train-iters 40 -> 80"});
  // A constant schedule has no decay length and no minimum.
  TrainConfig c_saved = base_config(), c_now = base_config();
  c_saved.lr_decay_style = c_now.lr_decay_style = "constant";
  c_now.train_iters = 100;
  c_now.min_lr = 0;
  REQUIRE(check_resume(c_now, c_saved).refused.empty());
  // The override flags accept any schedule; the changes are reported.
  TrainConfig now = base_config();
  now.lr = 1e-2;
  now.lr_decay_style = "linear";
  now.override_opt_param_scheduler = true;
  const ResumeCheck o = check_resume(now, base_config());
  REQUIRE(o.refused.empty());
  REQUIRE(std::find(o.changed.begin(), o.changed.end(), "--lr 0.003 -> 0.01") != o.changed.end());
  now.override_opt_param_scheduler = false;
  now.use_checkpoint_opt_param_scheduler = true;
  REQUIRE(check_resume(now, base_config()).refused.empty());
}

TEST_CASE("resuming with use-checkpoint-opt_param-scheduler takes the checkpoint's schedule, decay length included", "[actors][run]") {
  TrainConfig saved = base_config();
  TrainConfig now = base_config();
  now.lr = 1;
  now.min_lr = 0.5;
  now.lr_decay_style = "linear";
  now.lr_warmup_iters = 0;
  now.train_iters = 90;
  use_checkpoint_schedule(now, saved);
  REQUIRE(now.lr == saved.lr);
  REQUIRE(now.min_lr == saved.min_lr);
  REQUIRE(now.lr_decay_style == saved.lr_decay_style);
  REQUIRE(now.lr_warmup_iters == saved.lr_warmup_iters);
  REQUIRE(now.lr_decay_iters == saved.train_iters);  // the saved run decayed over its --train-iters
  REQUIRE(now.train_iters == 90);                     // the run may still go on longer
}

TEST_CASE("allowed changes on resume are listed, not refused", "[actors][run]") {
  const TrainConfig saved = base_config();
  TrainConfig now = saved;
  now.tensor_model_parallel_size = 2;
  now.zero_stage = 1;
  now.global_batch_size = 16;
  now.data_path = {"0.5", "a_text_document", "0.5", "b_text_document"};
  now.weight_decay = 0.2;
  const ResumeCheck r = check_resume(now, saved);
  REQUIRE(r.refused.empty());
  REQUIRE(r.changed.size() == 5);
}

TEST_CASE("a --save folder holding another run's checkpoints is refused", "[actors][run]") {
  TempDir tmp;
  const std::string save = (tmp.path / "ck").string();
  REQUIRE(check_save_folder(save, "aaaa", "").is_ok());  // does not exist yet
  fs::create_directories(save);
  REQUIRE(check_save_folder(save, "aaaa", "").is_ok());  // empty

  const TrainConfig cfg = base_config();
  write_checkpoint(save, 30, cfg, "bbbb");
  auto latest = latest_run(save);
  REQUIRE(latest.is_ok());
  REQUIRE(latest->found);
  REQUIRE(latest->iteration == 30);
  REQUIRE(latest->run_id == "bbbb");
  REQUIRE(latest->config.seed == cfg.seed);

  const Status other = check_save_folder(save, "aaaa", "");
  REQUIRE(other.is_bad_input());
  REQUIRE(other.message().find("holds the checkpoints of another run") != std::string::npos);
  REQUIRE(other.message().find("--seed 7") != std::string::npos);
  REQUIRE(other.message().find("iteration 30") != std::string::npos);
  REQUIRE(other.message().find("--load " + save) != std::string::npos);
  REQUIRE(check_save_folder(save, "bbbb", "").is_ok());    // the same run (a restart)
  REQUIRE(check_save_folder(save, "bbbb", save).is_ok());  // --load and --save of the same run

  // A checkpoint from before run ids: only the folder being resumed may be written.
  const std::string legacy = (tmp.path / "legacy").string();
  write_checkpoint(legacy, 5, cfg, "");
  REQUIRE(latest_run(legacy)->run_id.empty());
  REQUIRE(check_save_folder(legacy, "aaaa", "").is_bad_input());
  REQUIRE(check_save_folder(legacy, "aaaa", legacy).is_ok());
  REQUIRE(check_save_folder(legacy, "aaaa", save).is_bad_input());
}

// --finetune and --load of a Hugging Face folder: only what the parameters' shapes follow from must agree.
TEST_CASE("finetune: seed, schedule, batch and sequence may differ; shapes may not", "[finetune]") {
  const TrainConfig saved = base_config();
  TrainConfig now = base_config();
  now.seed = saved.seed + 7;
  now.lr = saved.lr * 3;
  now.lr_decay_style = "constant";
  now.train_iters = 5;
  now.global_batch_size = 8;
  now.model.seq_length = 9;
  CHECK(check_finetune(now, saved).refused.empty());
  CHECK_FALSE(check_resume(now, saved).refused.empty());  // a resume would refuse the seed and schedule
  now.model.num_layers = 4;
  now.model.hidden_size = 60;
  now.model.num_attention_heads = 4;
  now.model.max_position_embeddings = 32;
  now.model.vocab_size = 50257;
  const ResumeCheck r = check_finetune(now, saved);
  CHECK(r.refused.size() == 5);
  const std::string m = r.status("hf", /*finetune=*/true).message();
  CHECK_THAT(m, Contains("cannot fine-tune from the checkpoint in hf") && Contains("--num-layers is 4") &&
                    Contains("--hidden-size") && Contains("--num-attention-heads") &&
                    Contains("--max-position-embeddings") && Contains("vocabulary size"));
  TrainConfig eps = base_config();
  eps.model.layernorm_epsilon = 1e-6;
  eps.tokenizer_type = "GPT2BPETokenizer";
  const ResumeCheck changed = check_finetune(eps, saved);
  CHECK(changed.refused.empty());
  CHECK(changed.changed.size() == 2);
}

TEST_CASE("finetune: the config a Hugging Face folder stands for", "[finetune]") {
  HfModel m;
  m.config.n_layer = 2;
  m.config.n_embd = 64;
  m.config.n_head = 4;
  m.config.n_positions = 128;
  m.config.vocab_size = 257;
  m.config.layer_norm_epsilon = 1e-6;
  m.config.tokenizer_type = "ByteLevelTokenizer";
  TrainConfig c = imported_train_config(m);
  CHECK(c.model.num_layers == 2);
  CHECK(c.model.hidden_size == 64);
  CHECK(c.model.num_attention_heads == 4);
  CHECK(c.model.max_position_embeddings == 128);
  CHECK(c.model.seq_length == 128);
  CHECK(c.model.vocab_size == 257);
  CHECK(c.model.layernorm_epsilon == 1e-6);
  CHECK(c.tokenizer_type == "ByteLevelTokenizer");
  CHECK(c.model.validate().is_ok());
  m.vocab_file = "/x/vocab.json";
  m.merge_file = "/x/merges.txt";
  c = imported_train_config(m);  // the folder's tokenizer files win
  CHECK(c.tokenizer_type == "GPT2BPETokenizer");
  CHECK(c.vocab_file == "/x/vocab.json");
  m = HfModel{};
  CHECK(imported_train_config(m).tokenizer_type == "GPT2BPETokenizer");
  // The stored form reads back (the checkpoint ckpt import writes holds it).
  auto back = TrainConfig::from_json(imported_train_config(m).to_json());
  REQUIRE(back.is_ok());
  CHECK(back->model.num_layers == 12);
}
