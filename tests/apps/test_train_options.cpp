// `troupe train` flags: parsing, DeepSpeed JSON merging (flags win), validation messages, and that
// validation writes nothing.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/train_options.hpp"
#include "tests/test_util.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// A directory with what a valid run needs: the .bin/.idx pair and GPT-2 tokenizer files (contents
// are never read by validation, only their existence).
struct Workspace {
  test::TempDir dir;
  std::string prefix = dir.str("corpus_text_document");
  Workspace() {
    write_file(prefix + ".bin", "x");
    write_file(prefix + ".idx", "x");
    write_file(dir.str("vocab.json"), "{}");
    write_file(dir.str("merges.txt"), "#version: 0.2\n");
  }
  // The flags every valid run needs, plus `extra`; --train-iters 100 unless `extra` sets it.
  std::vector<std::string> args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {"--data-path",         prefix,         "--vocab-file",
                                  dir.str("vocab.json"), "--merge-file", dir.str("merges.txt")};
    if (std::find(extra.begin(), extra.end(), "--train-iters") == extra.end())
      a.insert(a.end(), {"--train-iters", "100"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string ds(const std::string& json_text, const std::string& name = "ds.json") const {
    write_file(dir.str(name), json_text);
    return dir.str(name);
  }
};

// "--a 1 --b 2" -> {"--a", "1", "--b", "2"}.
std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

struct Parsed {
  TrainConfig cfg;
  Status status;
};

// Parses `args` as `troupe train` would (CLI11's vector parse takes the arguments reversed), then
// finalizes; world_size: the ranks troupe launch started (1: one process).
Parsed parse(std::vector<std::string> args, int world_size = 1) {
  Parsed p;
  CLI::App app{"troupe train (test)"};
  add_train_options(&app, &p.cfg);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  p.status = finalize_train_config(app, &p.cfg, world_size);
  return p;
}

Parsed parse_ok(std::vector<std::string> args, int world_size = 1) {
  Parsed p = parse(std::move(args), world_size);
  INFO(p.status.message());
  REQUIRE(p.status.is_ok());
  return p;
}

std::string parse_error(std::vector<std::string> args, int world_size = 1) {
  Parsed p = parse(std::move(args), world_size);
  REQUIRE_FALSE(p.status.is_ok());
  return p.status.message();
}

TEST_CASE("train options: CLI11's vector parse expects reversed arguments", "[train_options]") {
  TrainConfig cfg;
  CLI::App app{"t"};
  add_train_options(&app, &cfg);
  std::vector<std::string> in_order = {"--lr", "0.25"};
  CHECK_THROWS_AS(app.parse(in_order),
                  CLI::ParseError);  // "0.25" is read first, as a stray positional
  std::vector<std::string> reversed = {"0.25", "--lr"};
  app.parse(reversed);
  CHECK(cfg.lr == 0.25);
}

TEST_CASE("train options: flags bind to the config, derived defaults follow", "[train_options]") {
  Workspace ws;
  Parsed p = parse_ok(ws.args(words(
      "--num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 512 "
      "--micro-batch-size 2 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 10 "
      "--lr-decay-iters 90 --weight-decay 0.1 --adam-beta1 0.85 --adam-beta2 0.95 --adam-eps 1e-6 "
      "--clip-grad 0.5 --seed 7 --split 90,10 --no-shuffle --save-interval 20 --eval-interval 50 "
      "--eval-iters 3 --log-interval 5 --num-threads 2 --init-method-std 0.01 "
      "--make-vocab-size-divisible-by 64 --lr-warmup-init 1e-6 --lr-warmup-style log")));
  const TrainConfig& c = p.cfg;
  CHECK(c.model.num_layers == 6);
  CHECK(c.model.hidden_size == 384);
  CHECK(c.model.num_attention_heads == 6);
  CHECK(c.model.seq_length == 512);
  CHECK(c.model.max_position_embeddings == 512);  // derived: = --seq-length
  CHECK(c.model.init_method_std == 0.01);
  CHECK(c.model.make_vocab_size_divisible_by == 64);
  CHECK(c.model.vocab_size == 0);  // left for the tokenizer
  CHECK(c.micro_batch_size == 2);
  CHECK(c.global_batch_size == 2);  // derived: = --micro-batch-size
  CHECK(c.lr == 3e-4);
  CHECK(c.min_lr == 3e-5);
  CHECK(c.lr_decay_style == "cosine");
  CHECK(c.lr_warmup_iters == 10);
  CHECK(c.lr_decay_iters == 90);
  CHECK(c.lr_warmup_init == 1e-6);
  CHECK(c.lr_warmup_style == "log");
  CHECK(c.train_iters == 100);
  CHECK(c.weight_decay == 0.1);
  CHECK(c.adam_beta1 == 0.85);
  CHECK(c.adam_beta2 == 0.95);
  CHECK(c.adam_eps == 1e-6);
  CHECK(c.clip_grad == 0.5);
  CHECK(c.seed == 7);
  CHECK(c.split == "90,10");
  CHECK(c.no_shuffle);
  CHECK(c.save_interval == 20);
  CHECK(c.eval_interval == 50);
  CHECK(c.eval_iters == 3);
  CHECK(c.log_interval == 5);
  CHECK(c.num_threads == 2);
  CHECK(c.data_path == std::vector<std::string>{ws.prefix});

  Parsed q = parse_ok(ws.args({"--seq-length", "128", "--max-position-embeddings", "1024",
                               "--micro-batch-size", "2", "--global-batch-size", "8"}));
  CHECK(q.cfg.model.max_position_embeddings == 1024);
  CHECK(q.cfg.global_batch_size == 8);
  CHECK(q.cfg.grad_accumulation_steps() == 4);
}

TEST_CASE("train options: every flag has help text; unknown flags and bad types throw",
          "[train_options]") {
  TrainConfig cfg;
  CLI::App app{"t"};
  add_train_options(&app, &cfg);
  for (const CLI::Option* o : app.get_options()) {
    INFO(o->get_name());
    CHECK_FALSE(o->get_description().empty());
  }
  const std::string help = app.help();
  for (const char* flag : {"--num-layers",
                           "--hidden-size",
                           "--num-attention-heads",
                           "--seq-length",
                           "--max-position-embeddings",
                           "--make-vocab-size-divisible-by",
                           "--init-method-std",
                           "--micro-batch-size",
                           "--global-batch-size",
                           "--lr",
                           "--min-lr",
                           "--lr-decay-style",
                           "--lr-warmup-iters",
                           "--lr-decay-iters",
                           "--train-iters",
                           "--weight-decay",
                           "--adam-beta1",
                           "--adam-beta2",
                           "--adam-eps",
                           "--clip-grad",
                           "--seed",
                           "--data-path",
                           "--split",
                           "--tokenizer-type",
                           "--vocab-file",
                           "--merge-file",
                           "--no-shuffle",
                           "--save",
                           "--save-interval",
                           "--load",
                           "--eval-interval",
                           "--eval-iters",
                           "--log-interval",
                           "--metrics-file",
                           "--num-threads",
                           "--deepspeed-config",
                           "--deepspeed_config",
                           "--tensor-model-parallel-size",
                           "--pipeline-model-parallel-size",
                           "--data-parallel-size",
                           "--zero-stage",
                           "--pipeline-schedule",
                           "--num-layers-per-virtual-pipeline-stage",
                           "--recompute-granularity",
                           "--sequence-parallel",
                           "--timeline",
                           "Parallelism"}) {
    CHECK_THAT(help, Contains(flag));
  }
  CHECK_THAT(help, Contains("GPT2BPETokenizer"));  // a default value shown

  std::vector<std::string> unknown = {"3", "--num-layer"};
  try {
    app.parse(unknown);
    FAIL("an unknown flag must throw");
  } catch (const CLI::ParseError& e) {
    CHECK_THAT(std::string(e.what()), Contains("--num-layer"));
  }
  std::vector<std::string> bad_type = {"fast", "--lr"};
  try {
    app.parse(bad_type);
    FAIL("a non-number --lr must throw");
  } catch (const CLI::ParseError& e) {
    CHECK_THAT(std::string(e.what()), Contains("--lr"));
  }
}

TEST_CASE("train options: bad values name the flag and the fix", "[train_options]") {
  Workspace ws;
  struct Case {
    std::vector<std::string> extra;
    const char* flag;
  };
  const Case cases[] = {
      {{"--num-layers", "0"}, "--num-layers must be positive"},
      {{"--hidden-size", "0"}, "--hidden-size must be positive"},
      {{"--num-attention-heads", "0"}, "--num-attention-heads must be positive"},
      {{"--num-attention-heads", "3"}, "--num-attention-heads 3 does not divide --hidden-size 256"},
      {{"--seq-length", "0"}, "--seq-length must be positive"},
      {{"--max-position-embeddings", "128"}, "--max-position-embeddings 128 is smaller"},
      {{"--make-vocab-size-divisible-by", "0"}, "--make-vocab-size-divisible-by"},
      {{"--init-method-std", "0"}, "--init-method-std"},
      {{"--micro-batch-size", "0"}, "--micro-batch-size must be positive"},
      {{"--micro-batch-size", "4", "--global-batch-size", "6"}, "--global-batch-size 6 is not a positive multiple"},
      {{"--global-batch-size", "0"}, "--global-batch-size 0"},
      {{"--train-iters", "0"}, "--train-iters must be positive"},
      {{"--lr", "-1e-3"}, "--lr must be >= 0"},
      {{"--lr", "1e-4", "--min-lr", "1e-3"}, "--min-lr must be in [0, --lr"},
      {{"--min-lr", "-1"}, "--min-lr"},
      {{"--lr-warmup-init", "-1"}, "--lr-warmup-init"},
      {{"--lr-decay-style", "exponential"}, "--lr-decay-style is \"exponential\""},
      {{"--lr-warmup-style", "cubic"}, "--lr-warmup-style is \"cubic\""},
      {{"--lr-warmup-iters", "-1"}, "--lr-warmup-iters must be >= 0"},
      {{"--lr-warmup-iters", "100"}, "--lr-warmup-iters 100 is not below the 100 decay iterations"},
      {{"--lr-warmup-iters", "50", "--lr-decay-iters", "40"}, "(--lr-decay-iters)"},
      {{"--lr-warmup-style", "log", "--lr-warmup-iters", "1"}, "--lr-warmup-iters is 1"},
      {{"--lr-decay-iters", "-5"}, "--lr-decay-iters must be >= 0"},
      {{"--adam-beta1", "1"}, "--adam-beta1 must be in [0, 1)"},
      {{"--adam-beta2", "-0.1"}, "--adam-beta2 must be in [0, 1)"},
      {{"--adam-eps", "0"}, "--adam-eps must be positive"},
      {{"--clip-grad", "-1"}, "--clip-grad must be >= 0"},
      {{"--weight-decay", "-0.01"}, "--weight-decay must be >= 0"},
      {{"--tokenizer-type", "SentencePiece"}, "--tokenizer-type is \"SentencePiece\""},
      {{"--split", "90,x.y.z"}, "--split"},
      {{"--split", "0,0,0"}, "--split"},
      {{"--split", "1,2,3,4"}, "--split"},
      {{"--eval-interval", "0"}, "--eval-interval must be positive"},
      {{"--log-interval", "0"}, "--log-interval must be positive"},
      {{"--save-interval", "-1"}, "--save-interval must be >= 0"},
      {{"--eval-iters", "-1"}, "--eval-iters must be >= 0"},
      {{"--num-threads", "-2"}, "--num-threads must be >= 0"},
  };
  for (const Case& c : cases) {
    const std::string message = parse_error(ws.args(c.extra));
    INFO(message);
    CHECK_THAT(message, Contains(c.flag));
    CHECK_THAT(message, Contains(" -- "));  // then the fix
  }
  // A constant schedule does not decay, so a warm-up as long as training is fine.
  parse_ok(ws.args({"--lr-warmup-iters", "100", "--lr-decay-style", "constant"}));
  // --split is checked by the data loader's parser, which reads it as Megatron-LM does: the '/' form
  // and the quotes a script leaves inside the value are separators.
  CHECK(parse_ok(ws.args({"--split", "969/30/1"})).cfg.split == "969/30/1");
  CHECK(parse_ok(ws.args({"--split", "'99,1,0'"})).cfg.split == "'99,1,0'");
}

TEST_CASE("train options: files are checked, nothing is created", "[train_options]") {
  Workspace ws;
  SECTION("data") {
    CHECK_THAT(parse_error({"--train-iters", "10", "--vocab-file", ws.dir.str("vocab.json"),
                            "--merge-file", ws.dir.str("merges.txt")}),
               Contains("--data-path is required") && Contains("troupe preprocess"));
    fs::remove(ws.prefix + ".idx");
    CHECK_THAT(parse_error(ws.args()),
               Contains(ws.prefix + ".idx not found") && Contains("troupe preprocess"));
  }
  SECTION("tokenizer files") {
    CHECK_THAT(parse_error({"--train-iters", "10", "--data-path", ws.prefix, "--merge-file",
                            ws.dir.str("merges.txt")}),
               Contains("--vocab-file is required"));
    CHECK_THAT(parse_error({"--train-iters", "10", "--data-path", ws.prefix, "--vocab-file",
                            ws.dir.str("vocab.json"), "--merge-file", ws.dir.str("nope.txt")}),
               Contains("--merge-file") && Contains("nope.txt not found"));
    // The byte-level tokenizer needs neither.
    parse_ok({"--train-iters", "10", "--data-path", ws.prefix, "--tokenizer-type",
              "ByteLevelTokenizer"});
  }
  SECTION("load") {
    const std::string run = ws.dir.str("run0");
    CHECK_THAT(parse_error(ws.args({"--load", run})),
               Contains("--load") && Contains("is not a directory"));
    fs::create_directories(run);
    CHECK_THAT(parse_error(ws.args({"--load", run})),
               Contains("latest_checkpointed_iteration.txt"));
    write_file(run + "/latest_checkpointed_iteration.txt", "10");
    CHECK(parse_ok(ws.args({"--load", run})).cfg.load == run);
  }
  SECTION("metrics file") {
    CHECK_THAT(parse_error(ws.args({"--metrics-file", ws.dir.str("no/such/dir/m.jsonl")})),
               Contains("--metrics-file directory") && Contains("does not exist"));
    CHECK_THAT(parse_error(ws.args({"--metrics-file", ws.dir.str()})), Contains("is a directory"));
    parse_ok(ws.args({"--metrics-file", ws.dir.str("m.jsonl")}));
    CHECK_FALSE(fs::exists(ws.dir.str("m.jsonl")));
  }
  SECTION("timeline") {
    CHECK_THAT(parse_error(ws.args({"--timeline", ws.dir.str("no/such/dir/t.json")})),
               Contains("--timeline directory") && Contains("does not exist") &&
                   Contains("create it first"));
    CHECK_THAT(parse_error(ws.args({"--timeline", ws.dir.str()})),
               Contains("--timeline") && Contains("is a directory") && Contains("timeline.json"));
    CHECK(parse_ok(ws.args({"--timeline", ws.dir.str("t.json")})).cfg.timeline ==
          ws.dir.str("t.json"));
    CHECK_FALSE(fs::exists(ws.dir.str("t.json")));
  }
  SECTION("save") {
    const std::string nested = ws.dir.str("ckpt/a/b");
    parse_ok(ws.args({"--save", nested}));
    CHECK_FALSE(fs::exists(ws.dir.str("ckpt")));  // validation created nothing
    write_file(ws.dir.str("plain"), "x");
    CHECK_THAT(parse_error(ws.args({"--save", ws.dir.str("plain")})),
               Contains("is not a directory"));
    CHECK_THAT(parse_error(ws.args({"--save", ws.dir.str("plain/sub")})),
               Contains("--save") && Contains("cannot be created"));
    // A bad config elsewhere must not create --save either.
    parse_error(ws.args({"--save", nested, "--lr", "-1"}));
    CHECK_FALSE(fs::exists(ws.dir.str("ckpt")));
  }
}

const char* kFullDeepSpeed = R"({
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 8,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1,
                           "adam_w_mode": true}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 5e-4, "warmup_num_steps": 10,
                           "warmup_type": "linear", "total_num_steps": 100}},
  "gradient_clipping": 0.5,
  "steps_per_print": 7,
  "wall_clock_breakdown": true,
  "zero_optimization": {"stage": 0},
  "fp16": {"enabled": false},
  "bf16": {"enabled": false}
})";

// Megatron-DeepSpeed passes its own optimizer and scheduler to deepspeed.initialize: the file's
// "optimizer" and "scheduler" blocks are ignored (a note each), and the flags, or Megatron's
// defaults, decide; the keys DeepSpeed honours beside a client optimizer map to their flags.
TEST_CASE("train options: each DeepSpeed key maps to its setting", "[train_options][deepspeed]") {
  Workspace ws;
  const std::string file = ws.ds(kFullDeepSpeed);
  std::vector<std::string> notes;
  Parsed p;
  {
    CLI::App app{"troupe train (test)"};
    add_train_options(&app, &p.cfg);
    std::vector<std::string> args = ws.args({"--deepspeed-config", file});
    std::reverse(args.begin(), args.end());
    app.parse(args);
    p.status = finalize_train_config(app, &p.cfg, 1, &notes);
  }
  REQUIRE(p.status.is_ok());
  const TrainConfig& c = p.cfg;
  const TrainConfig d;
  CHECK(c.global_batch_size == 16);
  CHECK(c.micro_batch_size == 2);
  CHECK(c.grad_accumulation_steps() == 8);
  CHECK(c.clip_grad == 0.5);
  CHECK(c.log_interval == 7);
  CHECK(c.timing_log_level == 2);
  CHECK(c.deepspeed_config == file);
  // Not the file's AdamW (lr 3e-4, betas 0.8/0.95, eps 1e-6, weight decay 0.1) nor its
  // WarmupDecayLR: Megatron's defaults, as Megatron-DeepSpeed's pretrain_gpt.py trains.
  CHECK(c.lr == d.lr);
  CHECK(c.adam_beta1 == d.adam_beta1);
  CHECK(c.adam_beta2 == d.adam_beta2);
  CHECK(c.adam_eps == d.adam_eps);
  CHECK(c.weight_decay == d.weight_decay);
  CHECK(c.lr_warmup_init == d.lr_warmup_init);
  CHECK(c.lr_warmup_iters == d.lr_warmup_iters);
  CHECK(c.lr_warmup_style == d.lr_warmup_style);
  CHECK(c.lr_decay_style == d.lr_decay_style);
  CHECK(c.lr_decay_iters == d.lr_decay_iters);
  CHECK(c.min_lr == d.min_lr);
  const auto noted = [&](const std::string& what) {
    return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) { return n.rfind(what, 0) == 0; });
  };
  CHECK(noted("\"optimizer\" in " + file + ": ignored (with its params adam_w_mode, betas, eps, lr, weight_decay)"));
  CHECK(noted("\"scheduler\" in " + file + ": ignored"));
  // DeepSpeed's own spelling of the flag.
  CHECK(parse_ok(ws.args({"--deepspeed_config", file})).cfg.global_batch_size == 16);
}

TEST_CASE("train options: explicit flags beat the DeepSpeed file", "[train_options][deepspeed]") {
  Workspace ws;
  const std::string file = ws.ds(kFullDeepSpeed);
  std::vector<std::string> flags = words(
      "--lr 1e-4 --micro-batch-size 4 --clip-grad 2 --log-interval 3 --lr-decay-style cosine "
      "--adam-beta1 0.7 --weight-decay 0.01 --lr-warmup-iters 5 --lr-decay-iters 80 --min-lr 1e-5 "
      "--lr-warmup-init 0");
  flags.insert(flags.end(), {"--deepspeed-config", file});
  const TrainConfig c = parse_ok(ws.args(flags)).cfg;
  CHECK(c.lr == 1e-4);
  CHECK(c.micro_batch_size == 4);
  CHECK(c.global_batch_size == 16);  // still from train_batch_size
  CHECK(c.clip_grad == 2);
  CHECK(c.log_interval == 3);
  CHECK(c.lr_decay_style == "cosine");
  CHECK(c.adam_beta1 == 0.7);
  CHECK(c.adam_beta2 == 0.999);  // not given: Megatron's default (the file's optimizer is ignored)
  CHECK(c.weight_decay == 0.01);
  CHECK(c.lr_warmup_iters == 5);
  CHECK(c.lr_decay_iters == 80);
  CHECK(c.min_lr == 1e-5);
  CHECK(c.lr_warmup_init == 0.0);
  CHECK(c.lr_warmup_style == "linear");
  CHECK(c.adam_eps == 1e-8);

  const TrainConfig g =
      parse_ok(ws.args({"--deepspeed-config", file, "--global-batch-size", "4"})).cfg;
  CHECK(g.global_batch_size == 4);
  CHECK(g.micro_batch_size == 2);
}

TEST_CASE("train options: DeepSpeed batch rules", "[train_options][deepspeed]") {
  Workspace ws;
  auto with = [&](const std::string& json_text, std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--deepspeed-config", ws.ds(json_text)});
    return parse(ws.args(extra));
  };
  auto ok = [&](const std::string& json_text, std::vector<std::string> extra = {}) {
    Parsed p = with(json_text, std::move(extra));
    INFO(p.status.message());
    REQUIRE(p.status.is_ok());
    return p.cfg;
  };
  TrainConfig c = ok(R"({"train_batch_size": 32})");  // micro = batch, gas = 1
  CHECK((c.micro_batch_size == 32 && c.global_batch_size == 32));
  c = ok(R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})");
  CHECK((c.micro_batch_size == 8 && c.global_batch_size == 32));
  c = ok(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})");
  CHECK((c.micro_batch_size == 4 && c.global_batch_size == 8));
  c = ok(R"({"train_micro_batch_size_per_gpu": 4})");
  CHECK((c.micro_batch_size == 4 && c.global_batch_size == 4));
  c = ok(R"({"gradient_accumulation_steps": 4})", {"--micro-batch-size", "2"});
  CHECK((c.micro_batch_size == 2 && c.global_batch_size == 8));
  c = ok(R"({"train_batch_size": 16})", {"--micro-batch-size", "4"});
  CHECK((c.micro_batch_size == 4 && c.global_batch_size == 16));

  Parsed bad = with(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                        "gradient_accumulation_steps": 4})");
  CHECK_THAT(bad.status.message(),
             Contains("\"train_batch_size\" is 16") && Contains("2 * 4 * 1 = 8"));
  bad = with(R"({"train_batch_size": 30, "gradient_accumulation_steps": 4})");
  CHECK_THAT(bad.status.message(), Contains("not divisible by gradient_accumulation_steps"));
  bad = with(R"({"train_batch_size": 0})");
  CHECK_THAT(bad.status.message(), Contains("\"train_batch_size\" must be positive"));
  bad = with(R"({"train_batch_size": 8.5})");
  CHECK_THAT(bad.status.message(), Contains("\"train_batch_size\" must be an integer"));
  bad =
      with(R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4})");  // gas would be 1.5
  CHECK_THAT(bad.status.message(), Contains("--global-batch-size 6 is not a positive multiple") &&
                                       Contains("\"train_batch_size\" in"));
}

// Whatever the blocks say (types troupe would not build, DeepSpeed's legacy max_grad_norm, params
// DeepSpeed would reject), Megatron-DeepSpeed never hands them to DeepSpeed: the run trains with the
// flags' optimizer and schedule.
TEST_CASE("train options: the DeepSpeed file's optimizer and scheduler change nothing", "[train_options][deepspeed]") {
  Workspace ws;
  const std::vector<std::string> flags =
      words("--lr 2e-4 --lr-decay-style cosine --lr-warmup-iters 3 --adam-beta2 0.95");
  const TrainConfig want = parse_ok(ws.args(flags)).cfg;
  for (const char* json_text :
       {R"({"optimizer": {"type": "Adam", "params": {"lr": 0.00015, "max_grad_norm": 1.0, "betas": [0.9, 0.999]}}})",
        R"({"optimizer": {"type": "Lamb"}, "scheduler": {"type": "OneCycle"}})",
        R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}})",
        R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false, "betas": [0.9]}}})"}) {
    INFO(json_text);
    std::vector<std::string> args = flags;
    args.insert(args.end(), {"--deepspeed-config", ws.ds(json_text)});
    const TrainConfig c = parse_ok(ws.args(args)).cfg;
    CHECK(c.lr == want.lr);
    CHECK(c.adam_beta1 == want.adam_beta1);
    CHECK(c.adam_beta2 == 0.95);
    CHECK(c.adam_eps == want.adam_eps);
    CHECK(c.weight_decay == want.weight_decay);
    CHECK(c.lr_decay_style == "cosine");
    CHECK(c.lr_warmup_iters == 3);
    CHECK(c.lr_warmup_style == "linear");
    CHECK(c.lr_decay_iters == want.lr_decay_iters);
  }
}

TEST_CASE("train options: DeepSpeed file errors name the key and the file",
          "[train_options][deepspeed]") {
  Workspace ws;
  auto error = [&](const std::string& json_text) {
    const std::string file = ws.ds(json_text);
    Parsed p = parse(ws.args({"--deepspeed-config", file}));
    REQUIRE_FALSE(p.status.is_ok());
    CHECK_THAT(p.status.message(), Contains(file));
    return p.status.message();
  };
  CHECK_THAT(error(R"({"train_batch_size": 8, "foo": 1})"), Contains("\"foo\" is not a key troupe understands") &&
                                                                Contains("train_batch_size, ") &&
                                                                Contains("zero_optimization"));
  CHECK_THAT(error(R"({"zero_optimization": {"stage": 0, "sub_group_sise": 1e9}})"),
             Contains("\"zero_optimization.sub_group_sise\" is not a key troupe understands") &&
                 Contains("did you mean \"sub_group_size\"?"));
  CHECK_THAT(error(R"({"zero_optimization": {"stage": 0, "frobnicate": 1}})"),
             Contains("\"zero_optimization.frobnicate\" is not a key troupe understands") &&
                 Contains("overlap_comm") && Contains("offload_optimizer"));
  CHECK_THAT(error(R"({"zero_optimization": {"stage": 5}})"),
             Contains("\"zero_optimization.stage\" is 5; ZeRO stages are 0 to 3") &&
                 Contains("1 (optimizer states)"));
  CHECK_THAT(error(R"({"zero_optimization": {"stage": -1}})"), Contains("ZeRO stages are 0 to 3"));
  CHECK_THAT(error(R"({"zero_optimization": {"stage": "2"}})"),
             Contains("\"zero_optimization.stage\" must be an integer"));
  CHECK_THAT(error(R"({"fp16": {"enabled": true, "auto_cast": true}})"),
             Contains("\"fp16.auto_cast\" is true") && Contains("set it to false"));
  CHECK_THAT(error(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"),
             Contains("\"fp16.enabled\" and \"bf16.enabled\" are both true"));
  CHECK_THAT(error(R"({"fp16": {"enabled": "yes"}})"), Contains("must be true or false"));
  CHECK_THAT(error(R"({"gradient_clipping": "1.0"})"),
             Contains("\"gradient_clipping\" must be a number"));
  CHECK_THAT(error(R"({"steps_per_print": 2.5})"),
             Contains("\"steps_per_print\" must be an integer"));
  CHECK_THAT(error(R"({"wall_clock_breakdown": 1})"),
             Contains("\"wall_clock_breakdown\" must be true or false"));
  CHECK_THAT(error(R"({"optimizer": [1]})"), Contains("\"optimizer\" must be an object"));
  CHECK_THAT(error(R"([1, 2])"), Contains("must hold a JSON object"));
  CHECK_THAT(error(R"({"steps_per_print": 1, "steps_per_print": 2})"),
             Contains("\"steps_per_print\" appears twice"));
  // Malformed: the parser's line and column.
  CHECK_THAT(error("{\n  \"train_batch_size\": 8,\n  \"steps_per_print\" 2\n}"),
             Contains("is not valid JSON") && Contains("line 3"));
  // A bad value from the file: the message names the flag and points at the key in the file.
  CHECK_THAT(error(R"({"gradient_clipping": -1})"),
             Contains("--clip-grad must be >= 0") && Contains("\"gradient_clipping\" in"));

  const std::string missing = ws.dir.str("missing.json");
  Parsed p = parse(ws.args({"--deepspeed-config", missing}));
  REQUIRE_FALSE(p.status.is_ok());
  CHECK_THAT(p.status.message(), Contains(missing) && Contains("no such file"));
}

TEST_CASE("train options: the sample DeepSpeed config is accepted", "[train_options][deepspeed]") {
  Workspace ws;
  const std::string sample = test::source_dir() + "/docs/examples/ds_config.json";
  REQUIRE(fs::exists(sample));
  const TrainConfig c =
      parse_ok(ws.args({"--deepspeed-config", sample, "--train-iters", "2000"})).cfg;
  CHECK(c.lr_decay_style == "linear");
  CHECK(c.global_batch_size % c.micro_batch_size == 0);
}

TEST_CASE("train options: parallelism flags bind to the config", "[train_options][parallel_options]") {
  Workspace ws;
  std::vector<std::string> flags = words(
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
      "--data-parallel-size 3 --zero-stage 1 --pipeline-schedule gpipe "
      "--recompute-granularity selective --sequence-parallel --micro-batch-size 2");
  flags.insert(flags.end(), {"--timeline", ws.dir.str("trace.json")});
  const TrainConfig c = parse_ok(ws.args(flags)).cfg;
  CHECK(c.tensor_model_parallel_size == 2);
  CHECK(c.pipeline_model_parallel_size == 2);
  CHECK(c.data_parallel_size == 3);
  CHECK(c.resolved_dp() == 3);
  CHECK(c.zero_stage == 1);
  CHECK(c.pipeline_schedule == "gpipe");
  CHECK(c.num_layers_per_virtual_pipeline_stage == 0);
  CHECK(c.recompute_granularity == "selective");
  CHECK(c.sequence_parallel);
  CHECK(c.timeline == ws.dir.str("trace.json"));
  CHECK(c.global_batch_size == 6);  // Megatron's default: micro batch x data-parallel size
  CHECK(c.grad_accumulation_steps() == 1);

  // The defaults: one shard, 1F1B, no recomputation, no timeline.
  const TrainConfig d = parse_ok(ws.args()).cfg;
  CHECK(d.tensor_model_parallel_size == 1);
  CHECK(d.pipeline_model_parallel_size == 1);
  CHECK(d.data_parallel_size == 0);
  CHECK(d.resolved_dp() == 1);
  CHECK(d.zero_stage == 0);
  CHECK(d.pipeline_schedule == "1f1b");
  CHECK(d.recompute_granularity == "none");
  CHECK_FALSE(d.sequence_parallel);
  CHECK(d.timeline.empty());
  CHECK_FALSE(d.parallel());

  // Every schedule and granularity by name; Megatron has no "none" value but absent means none.
  for (const char* schedule : {"1f1b", "gpipe", "zb-h1"})
    CHECK(
        parse_ok(ws.args({"--pipeline-model-parallel-size", "2", "--pipeline-schedule", schedule}))
            .cfg.pipeline_schedule == schedule);
  for (const char* granularity : {"none", "full", "selective"})
    CHECK(parse_ok(ws.args({"--recompute-granularity", granularity})).cfg.recompute_granularity ==
          granularity);
  // Megatron: sequence parallelism needs tensor parallelism, and is silently off without it.
  CHECK_FALSE(parse_ok(ws.args({"--sequence-parallel"})).cfg.sequence_parallel);
  // Uneven pipeline stages are fine (troupe's split), as long as each has a layer.
  CHECK(parse_ok(ws.args({"--num-layers", "5", "--pipeline-model-parallel-size", "2"}))
            .cfg.pipeline_model_parallel_size == 2);
  CHECK(parse_ok(ws.args({"--pipeline-model-parallel-size", "4"})).cfg.model.num_layers == 4);
}

TEST_CASE("train options: the virtual-stage flag selects the interleaved schedule",
          "[train_options][parallel_options]") {
  Workspace ws;
  const std::vector<std::string> base = words("--num-layers 8 --pipeline-model-parallel-size 2");
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return ws.args(extra);
  };
  // As in Megatron: the flag alone switches to interleaved.
  TrainConfig c = parse_ok(with({"--num-layers-per-virtual-pipeline-stage", "2"})).cfg;
  CHECK(c.pipeline_schedule == "interleaved");
  CHECK(c.num_layers_per_virtual_pipeline_stage == 2);
  c = parse_ok(with({"--num-layers-per-virtual-pipeline-stage", "1", "--pipeline-schedule",
                     "interleaved"}))
          .cfg;
  CHECK(c.pipeline_schedule == "interleaved");
  // An explicit other schedule is a contradiction, not silently overridden.
  CHECK_THAT(parse_error(with(
                 {"--pipeline-schedule", "1f1b", "--num-layers-per-virtual-pipeline-stage", "2"})),
             Contains("--num-layers-per-virtual-pipeline-stage 2 is only used by "
                      "--pipeline-schedule interleaved, but the schedule is 1f1b") &&
                 Contains(" -- drop"));
  // The switch is named when it leads to an error.
  CHECK_THAT(parse_error(ws.args({"--num-layers-per-virtual-pipeline-stage", "2"})),
             Contains("--pipeline-schedule interleaved needs --pipeline-model-parallel-size 2 or "
                      "more, got 1") &&
                 Contains("comes from --num-layers-per-virtual-pipeline-stage, which selects it "
                          "as in Megatron"));
}

TEST_CASE("train options: parallel settings are validated with the flag and the fix",
          "[train_options][parallel_options]") {
  Workspace ws;
  struct Case {
    std::vector<std::string> extra;
    const char* what;  // the flag and the problem
    const char* fix;   // after " -- "
  };
  const Case cases[] = {
      {{"--tensor-model-parallel-size", "0"},
       "--tensor-model-parallel-size must be positive, got 0",
       "--tensor-model-parallel-size 1"},
      {{"--pipeline-model-parallel-size", "-1"},
       "--pipeline-model-parallel-size must be positive, got -1",
       "--pipeline-model-parallel-size 1"},
      {{"--data-parallel-size", "-1"},
       "--data-parallel-size must be >= 0, got -1",
       "use 0 to derive it"},
      {{"--num-attention-heads", "6", "--hidden-size", "384", "--tensor-model-parallel-size", "4"},
       "--num-attention-heads 6 is not divisible by --tensor-model-parallel-size 4",
       "a multiple of 4, or --tensor-model-parallel-size 3"},
      {{"--pipeline-model-parallel-size", "8"},
       "--pipeline-model-parallel-size 8 is more than --num-layers 4",
       "at most 4 stages"},
      {{"--pipeline-schedule", "zigzag"},
       "--pipeline-schedule is \"zigzag\"",
       "use one of 1f1b, gpipe, interleaved, zb-h1"},
      {{"--pipeline-schedule", "interleaved", "--num-layers-per-virtual-pipeline-stage", "1"},
       "--pipeline-schedule interleaved needs --pipeline-model-parallel-size 2 or more, got 1",
       "another --pipeline-schedule"},
      {{"--pipeline-schedule", "interleaved", "--pipeline-model-parallel-size", "2", "--num-layers",
        "8"},
       "--pipeline-schedule interleaved needs --num-layers-per-virtual-pipeline-stage N > 0",
       "use --num-layers-per-virtual-pipeline-stage 1 or 2"},
      {{"--num-layers-per-virtual-pipeline-stage", "3", "--pipeline-model-parallel-size", "2",
        "--num-layers", "8"},
       "--num-layers-per-virtual-pipeline-stage 3 does not split --num-layers 8 evenly",
       "use --num-layers-per-virtual-pipeline-stage 1 or 2"},
      {{"--num-layers-per-virtual-pipeline-stage", "4", "--pipeline-model-parallel-size", "2",
        "--num-layers", "8"},
       "--num-layers-per-virtual-pipeline-stage 4 leaves 1 model chunk per pipeline stage",
       "1 or 2"},
      {{"--num-layers-per-virtual-pipeline-stage", "1", "--pipeline-model-parallel-size", "2",
        "--num-layers", "3"},
       "--num-layers-per-virtual-pipeline-stage 1 does not split --num-layers 3",
       "no chunk size works for --num-layers 3 over 2 stages"},
      {{"--num-layers-per-virtual-pipeline-stage", "0", "--pipeline-model-parallel-size", "2",
        "--num-layers", "12"},
       "needs --num-layers-per-virtual-pipeline-stage N > 0",
       "1, 2 or 3"},
      {{"--data-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "6"},
       "--global-batch-size 6 is not a positive multiple of --micro-batch-size 2 x "
       "--data-parallel-size 2 = 4",
       "e.g. 8"},
      {{"--zero-stage", "4"},
       "--zero-stage is 4; ZeRO stages are 0 to 3",
       "use 0 (off), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)"},
      {{"--zero-stage", "-1"}, "--zero-stage is -1", "1 (optimizer states)"},
      {{"--recompute-granularity", "partial"},
       "--recompute-granularity is \"partial\"",
       "use full or selective, or leave the flag out"},
      {{"--tensor-model-parallel-size", "4", "--sequence-parallel", "--seq-length", "1",
        "--micro-batch-size", "2"},
       "--sequence-parallel splits the --micro-batch-size 2 x --seq-length 1 = 2 tokens",
       "drop --sequence-parallel"},
  };
  for (const Case& c : cases) {
    const std::string message = parse_error(ws.args(c.extra));
    INFO(message);
    CHECK_THAT(message, Contains(c.what));
    CHECK_THAT(message, Contains(std::string(" -- ")));
    CHECK_THAT(message.substr(message.find(" -- ")), Contains(c.fix));
  }
  // validate_train_config (no command line) checks the same.
  TrainConfig c;
  c.mock_data = true;
  c.train_iters = 10;
  c.tokenizer_type = "ByteLevelTokenizer";
  REQUIRE(validate_train_config(c).is_ok());
  c.num_layers_per_virtual_pipeline_stage = 2;  // with the default 1f1b
  CHECK_THAT(validate_train_config(c).message(),
             Contains("--num-layers-per-virtual-pipeline-stage 2 is only used by"));
}

TEST_CASE("train options: --device is cpu or cuda, and cuda takes every layout", "[train_options]") {
  TrainConfig c;
  c.mock_data = true;
  c.train_iters = 10;
  c.tokenizer_type = "ByteLevelTokenizer";
  c.device = "cuda";
  CHECK(validate_train_config(c).is_ok());  // whether a GPU is there is the run's to find
  c.tensor_model_parallel_size = 2;  // tensor and data parallelism and ZeRO run on GPUs (NCCL)
  c.zero_stage = 2;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  CHECK(validate_train_config(c).is_ok());
  CHECK(validate_world(c, 4).is_ok());
  c.offload_optimizer = "cpu";  // ZeRO-Offload: the moments on the host, AdamW on the CPU
  CHECK(validate_train_config(c).is_ok());
  c.pipeline_model_parallel_size = 2;  // one NCCL communicator per pipeline link and direction
  c.global_batch_size = 8;
  CHECK(validate_train_config(c).is_ok());
  c.pipeline_schedule = "interleaved";
  c.num_layers_per_virtual_pipeline_stage = 1;
  c.model.num_layers = 4;
  CHECK(validate_train_config(c).is_ok());
  c = TrainConfig{};
  c.mock_data = true;
  c.train_iters = 10;
  c.tokenizer_type = "ByteLevelTokenizer";
  c.device = "gpu";
  CHECK_THAT(validate_train_config(c).message(), Contains("--device is \"gpu\"") && Contains(" -- use cpu or cuda"));
}

TEST_CASE("train options: troupe launch's ranks must match tensor x pipeline x data",
          "[train_options][parallel_options]") {
  TrainConfig c;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.micro_batch_size = 4;
  c.global_batch_size = 16;
  SECTION("derived data-parallel size") {
    CHECK(validate_world(c, 4).is_ok());   // dp 1
    CHECK(validate_world(c, 8).is_ok());   // dp 2
    CHECK(validate_world(c, 16).is_ok());  // dp 4: 16 = 4 x 4
    CHECK_THAT(validate_world(c, 6).message(),
               Contains("--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 2 x "
                        "data-parallel 1 (derived from the ranks) = 4 ranks, but troupe launch "
                        "started 6") &&
                   Contains(" -- start a multiple of") && Contains("= 4 ranks"));
    CHECK_THAT(validate_world(c, 2).message(), Contains("= 4 ranks, but troupe launch started 2"));
    // 32 ranks: dp 8, and 16 sequences do not fill 8 replicas x 4.
    CHECK_THAT(validate_world(c, 32).message(),
               Contains("--global-batch-size 16 is not a positive multiple of --micro-batch-size "
                        "4 x data-parallel size 8 = 32 (troupe launch started 32 ranks)") &&
                   Contains(" -- ") && Contains("e.g. 32"));
  }
  SECTION("explicit data-parallel size") {
    c.data_parallel_size = 1;
    CHECK_THAT(validate_world(c, 8).message(),
               Contains("--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 2 x "
                        "--data-parallel-size 1 = 4 ranks, but troupe launch started 8") &&
                   Contains(" -- set --data-parallel-size 2") && Contains("or start 4 ranks"));
    c.data_parallel_size = 2;
    CHECK(validate_world(c, 8).is_ok());
    CHECK_THAT(validate_world(c, 12).message(), Contains("set --data-parallel-size 3"));
    CHECK_THAT(validate_world(c, 10).message(), Contains("start a multiple of"));
  }
  SECTION("sizes that make no sense") {
    CHECK_THAT(validate_world(c, 0).message(), Contains("0 ranks"));
    c.tensor_model_parallel_size = 0;
    CHECK_THAT(validate_world(c, 4).message(),
               Contains("--tensor-model-parallel-size must be positive"));
  }
  SECTION("through finalize_train_config") {
    Workspace ws;
    const std::vector<std::string> mp = words(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--micro-batch-size 4");
    // 8 ranks: dp 2, so the default global batch is 4 x 2.
    const TrainConfig d = parse_ok(ws.args(mp), 8).cfg;
    CHECK(d.global_batch_size == 8);
    CHECK(d.grad_accumulation_steps(8) == 1);
    std::vector<std::string> small = mp;
    small.insert(small.end(), {"--global-batch-size", "4"});
    CHECK(parse_ok(ws.args(small)).cfg.global_batch_size == 4);  // one process: dp 1
    CHECK_THAT(parse_error(ws.args(small), 8),
               Contains("--global-batch-size 4 is not a positive multiple of --micro-batch-size 4 "
                        "x data-parallel size 2 = 8 (troupe launch started 8 ranks)"));
    CHECK_THAT(parse_error(ws.args(mp), 6), Contains("but troupe launch started 6"));
  }
}

TEST_CASE("train options: DeepSpeed zero_optimization", "[train_options][deepspeed][parallel_options]") {
  Workspace ws;
  auto with = [&](const std::string& json_text, std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"--deepspeed-config", ws.ds(json_text)});
    return parse(ws.args(extra));
  };
  auto ok = [&](const std::string& json_text, std::vector<std::string> extra = {}) {
    Parsed p = with(json_text, std::move(extra));
    INFO(p.status.message());
    REQUIRE(p.status.is_ok());
    return p.cfg;
  };
  SECTION("stage, and --zero-stage wins") {
    for (int stage = 0; stage <= 3; ++stage)
      CHECK(ok(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + "}}").zero_stage ==
            stage);
    CHECK(ok(R"({"zero_optimization": {"stage": 2}})", {"--zero-stage", "1"}).zero_stage == 1);
    // Given with the default value: still wins.
    CHECK(ok(R"({"zero_optimization": {"stage": 3}})", {"--zero-stage", "0"}).zero_stage == 0);
    CHECK(ok(R"({"zero_optimization": {}})").zero_stage == 0);
    CHECK(ok(R"({"train_batch_size": 8})", {"--zero-stage", "2"}).zero_stage == 2);
  }
  SECTION("tuning keys are accepted and change nothing") {
    const TrainConfig c = ok(R"({"zero_optimization": {
      "stage": 3, "overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
      "allgather_partitions": true, "reduce_bucket_size": 5e8, "allgather_bucket_size": 200000000,
      "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5,
      "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": false, "round_robin_gradients": false,
      "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"}}})");
    CHECK(c.zero_stage == 3);
    TrainConfig expected = parse_ok(ws.args({"--zero-stage", "3"})).cfg;
    expected.deepspeed_config = c.deepspeed_config;
    CHECK(c.to_json() == expected.to_json());
  }
  SECTION("offload_optimizer sets --offload-optimizer and --offload-path; the flags win") {
    const TrainConfig cpu = ok(R"({"zero_optimization": {"stage": 2,
                        "offload_optimizer": {"device": "cpu", "pin_memory": true, "fast_init": false}}})");
    CHECK(cpu.offload_optimizer == "cpu");
    CHECK(cpu.offload_path.empty());
    const std::string swap = ws.dir.str("");
    const TrainConfig nvme = ok(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
                        "nvme_path": ")" + swap + R"(", "buffer_count": 4, "pipeline_read": true, "ratio": 1.0}}})");
    CHECK(nvme.offload_optimizer == "nvme");
    CHECK(nvme.offload_path == swap);
    // nvme_path is DeepSpeed's only with device nvme.
    CHECK(ok(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "nvme_path": "/x"}}})").offload_path.empty());
    CHECK(ok(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})",
             {"--offload-optimizer", "none"})
              .offload_optimizer == "none");
  }
  SECTION("offload errors name the key and the fix") {
    Parsed p = with(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})");
    CHECK_THAT(p.status.message(), Contains("--offload-optimizer is nvme but no --offload-path is given") &&
                                       Contains("zero_optimization.offload_optimizer.device"));
    p = with(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/no/such/dir"}}})");
    CHECK_THAT(p.status.message(), Contains("--offload-path /no/such/dir is not a directory") &&
                                       Contains("zero_optimization.offload_optimizer.nvme_path"));
    p = with(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})");
    CHECK_THAT(p.status.message(), Contains("\"zero_optimization.offload_optimizer.device\" is \"gpu\""));
    p = with(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
    CHECK_THAT(p.status.message(), Contains("a partial optimizer offload") && Contains("is not in troupe"));
    p = with(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "swap_everything": true}}})");
    CHECK_THAT(p.status.message(), Contains("swap_everything"));
    p = with(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})");
    REQUIRE_FALSE(p.status.is_ok());
    CHECK_THAT(p.status.message(), Contains("\"zero_optimization.offload_param\"") &&
                                       Contains("parameter offload is not in this build") &&
                                       Contains("remove the \"offload_param\" block"));
    p = with(R"({"zero_optimization": {"offload_optimizer": true}})");
    CHECK_THAT(p.status.message(),
               Contains("\"zero_optimization.offload_optimizer\" must be an object"));
  }
  SECTION("offload and restart flags") {
    CHECK_THAT(parse(ws.args({"--offload-optimizer", "disk"})).status.message(),
               Contains("--offload-optimizer is \"disk\""));
    CHECK_THAT(parse(ws.args({"--offload-path", ws.dir.str("")})).status.message(),
               Contains("--offload-path is only used by --offload-optimizer nvme"));
    CHECK_THAT(parse(ws.args({"--max-restarts", "2"})).status.message(),
               Contains("--max-restarts is 2, but without --save there is no checkpoint to restart from"));
    CHECK_THAT(parse(ws.args({"--max-restarts", "-1"})).status.message(), Contains("--max-restarts must be >= 0"));
    CHECK_THAT(parse(ws.args({"--distributed-timeout-minutes", "0"})).status.message(),
               Contains("--distributed-timeout-minutes must be positive"));
    CHECK(parse_ok(ws.args({"--distributed-timeout-minutes", "0.5"})).cfg.distributed_timeout_minutes == 0.5);
    CHECK_THAT(parse(ws.args({"--inspect-stall-seconds", "-1"})).status.message(),
               Contains("--inspect-stall-seconds must be >= 0"));
    CHECK(parse_ok(ws.args({"--inspect-stall-seconds", "2.5"})).cfg.inspect_stall_seconds == 2.5);
    CHECK(parse_ok(ws.args({})).cfg.inspect_stall_seconds == 0);
    CHECK_THAT(parse(ws.args({"--dashboard", "localhost:http"})).status.message(),
               Contains("--dashboard is \"localhost:http\", not [HOST:]PORT"));
    CHECK_THAT(parse(ws.args({"--dashboard", "70000"})).status.message(), Contains("a port from 0 to 65535"));
    CHECK(parse_ok(ws.args({"--dashboard", "0"})).cfg.dashboard == "0");
    CHECK(parse_ok(ws.args({"--dashboard", "[::1]:8080", "--inspect-file", ws.dir.str("i.json")})).cfg.inspect.empty());
    CHECK_THAT(parse(ws.args({"--inspect-file", ws.dir.str("i.json")})).status.message(),
               Contains("--inspect-file is only used with --inspect or --dashboard"));
    // The NaN watch is a switch of the run, not part of what a checkpoint records.
    CHECK(parse_ok(ws.args({"--watch-nan"})).cfg.watch_nan);
    CHECK(!parse_ok(ws.args({})).cfg.watch_nan);
    CHECK(parse_ok(ws.args({"--watch-nan"})).cfg.to_json() == parse_ok(ws.args({})).cfg.to_json());
    CHECK(parse_ok(ws.args({"--max-restarts", "2", "--save", ws.dir.str("ck")})).cfg.max_restarts == 2);
  }
  SECTION("tuning keys of the wrong type") {
    Parsed p = with(R"({"zero_optimization": {"overlap_comm": 1}})");
    CHECK_THAT(p.status.message(),
               Contains("\"zero_optimization.overlap_comm\" must be true or false"));
    p = with(R"({"zero_optimization": {"reduce_bucket_size": "lots"}})");
    CHECK_THAT(p.status.message(),
               Contains("\"zero_optimization.reduce_bucket_size\" must be a number of elements"));
    CHECK(with(R"({"zero_optimization": {"reduce_bucket_size": "auto"}})").status.is_ok());  // Hugging Face's
    p = with(R"({"zero_optimization": {"stage3_max_live_parameters": -1}})");
    CHECK_THAT(p.status.message(), Contains("\"zero_optimization.stage3_max_live_parameters\""));
    p = with(R"({"zero_optimization": {"allgather_bucket_size": 2.5}})");
    CHECK_THAT(p.status.message(), Contains("\"zero_optimization.allgather_bucket_size\""));
  }
  SECTION("DeepSpeed's batch rule multiplies by the data-parallel size") {
    const std::vector<std::string> dp2 = {"--data-parallel-size", "2"};
    TrainConfig c =
        ok(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", dp2);
    CHECK((c.micro_batch_size == 4 && c.global_batch_size == 16));
    CHECK(c.grad_accumulation_steps() == 2);
    c = ok(R"({"train_batch_size": 32})", dp2);  // micro = batch / dp
    CHECK((c.micro_batch_size == 16 && c.global_batch_size == 32));
    c = ok(R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})", dp2);
    CHECK((c.micro_batch_size == 4 && c.global_batch_size == 32));
    c = ok(R"({"train_micro_batch_size_per_gpu": 4})", dp2);  // batch = micro x dp
    CHECK((c.micro_batch_size == 4 && c.global_batch_size == 8));
    Parsed bad = with(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                          "gradient_accumulation_steps": 8})",
                      dp2);
    CHECK_THAT(bad.status.message(), Contains("2 * 8 * 2 = 32"));
    bad = with(R"({"train_batch_size": 24, "gradient_accumulation_steps": 8})", dp2);
    CHECK_THAT(bad.status.message(),
               Contains("24 is not divisible by gradient_accumulation_steps 8 x data-parallel "
                        "size 2 = 16"));
    bad = with(R"({"train_batch_size": 7})", dp2);
    CHECK_THAT(bad.status.message(), Contains("7 is not divisible by the data-parallel size 2"));
    // A value from the file that fails validation names the key.
    bad = with(R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2})", dp2);
    CHECK_THAT(bad.status.message(),
               Contains("--global-batch-size 6 is not a positive multiple of --micro-batch-size 2 "
                        "x --data-parallel-size 2 = 4") &&
                   Contains("\"train_batch_size\" in"));
    // Under troupe launch the derived data-parallel size counts: 8 ranks / (2 x 1) = 4.
    Parsed launched = parse(ws.args({"--tensor-model-parallel-size", "2", "--deepspeed-config",
                                     ws.ds(R"({"train_micro_batch_size_per_gpu": 2,
                                               "gradient_accumulation_steps": 3})")}),
                            8);
    INFO(launched.status.message());
    REQUIRE(launched.status.is_ok());
    CHECK(launched.cfg.global_batch_size == 24);
    CHECK(launched.cfg.grad_accumulation_steps(8) == 3);
  }
}

}  // namespace
TEST_CASE("train options: data blends as Megatron's nargs='*' lists", "[train_options]") {
  Workspace ws;
  const std::string other = ws.dir.str("other_text_document");
  write_file(other + ".bin", "x");
  write_file(other + ".idx", "x");
  // A later --data-path replaces the earlier list whole (argparse), here the one args() passes.
  Parsed p = parse_ok(ws.args({"--data-path", "0.3", ws.prefix, "0.7", other, "--seed", "5"}));
  CHECK(p.cfg.data_path == std::vector<std::string>{"0.3", ws.prefix, "0.7", other});
  CHECK(p.cfg.seed == 5);  // the list ends at the next flag
  p = parse_ok(ws.args({"--data-path", "0.3 " + ws.prefix + " 0.7 " + other}));
  CHECK(p.cfg.data_path.size() == 1);
  // Per-split paths instead of --data-path.
  p = parse_ok(ws.args({"--data-path", "", "--train-data-path", ws.prefix, other, "--valid-data-path", other}));
  CHECK(p.cfg.train_data_path == std::vector<std::string>{ws.prefix, other});
  CHECK(p.cfg.valid_data_path == std::vector<std::string>{other});
  CHECK(p.cfg.test_data_path.empty());
  // Refused, every problem at once.
  const std::string m =
      parse_error(ws.args({"--data-path", "0.5", ws.prefix, "0.5", ws.dir.str("gone"), "--split", "1,2,3,4"}));
  CHECK_THAT(m, Contains(ws.dir.str("gone") + ".bin and ") && Contains("--split '1,2,3,4' has 4 weights"));
  CHECK_THAT(parse_error(ws.args({"--train-data-path", ws.prefix})), Contains("a single data source"));
  CHECK_THAT(parse_error(ws.args({"--data-path", "", "--test-data-path", ws.prefix})),
             Contains("without --train-data-path"));
  CHECK_THAT(parse_error(ws.args({"--data-path", "0", ws.prefix, "0", other})), Contains("all 0"));
}


TEST_CASE("train options: Megatron's TensorBoard flags, kept out of checkpoints", "[train_options][tensorboard]") {
  Workspace ws;
  const TensorBoardConfig d = parse_ok(ws.args()).cfg.tensorboard;  // Megatron's defaults
  CHECK(d.dir.empty());
  CHECK(d.log_interval == 1);
  CHECK(d.queue_size == 1000);
  CHECK_FALSE(d.log_timers);
  CHECK(d.log_learning_rate);
  CHECK(d.log_loss_scale);
  CHECK_FALSE(d.log_validation_ppl);
  CHECK_FALSE(d.log_world_size);
  CHECK_FALSE(d.log_throughput);

  const std::string dir = ws.dir.str("tb/run");
  const Parsed p = parse_ok(ws.args({"--tensorboard-dir", dir, "--tensorboard-log-interval", "7",
                                     "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard",
                                     "--log-validation-ppl-to-tensorboard", "--log-world-size-to-tensorboard",
                                     "--log-throughput", "--log-batch-size-to-tensorboard",
                                     "--no-log-learnig-rate-to-tensorboard", "--no-log-loss-scale-to-tensorboard"}));
  const TensorBoardConfig& t = p.cfg.tensorboard;
  CHECK(t.dir == dir);
  CHECK(t.log_interval == 7);
  CHECK(t.queue_size == 5);
  CHECK(t.log_timers);
  CHECK(t.log_validation_ppl);
  CHECK(t.log_world_size);
  CHECK(t.log_throughput);
  CHECK_FALSE(t.log_learning_rate);
  CHECK_FALSE(t.log_loss_scale);
  CHECK_FALSE(fs::exists(ws.dir.str("tb")));  // validation creates nothing
  // The other spellings: the typo fixed, and current Megatron-LM's --disable-*.
  const TensorBoardConfig o = parse_ok(ws.args({"--no-log-learning-rate-to-tensorboard",
                                                "--disable-log-loss-scale-to-tensorboard"})).cfg.tensorboard;
  CHECK_FALSE(o.log_learning_rate);
  CHECK_FALSE(o.log_loss_scale);

  // Logging switches only: the checkpoint's config holds none of them, so a resumed run logs as
  // its own flags say.
  const std::string stored = p.cfg.to_json();
  CHECK(stored.find("tensorboard") == std::string::npos);
  CHECK(stored.find(dir) == std::string::npos);
  auto back = TrainConfig::from_json(stored);
  REQUIRE(back.is_ok());
  CHECK(back.value().tensorboard.dir.empty());

  write_file(ws.dir.str("a_file"), "x");
  CHECK_THAT(parse_error(ws.args({"--tensorboard-dir", ws.dir.str("a_file")})),
             Contains("--tensorboard-dir") && Contains("exists and is not a directory") && Contains(" -- "));
  CHECK_THAT(parse_error(ws.args({"--tensorboard-dir", ws.dir.str("a_file") + "/tb"})),
             Contains("--tensorboard-dir") && Contains("is not a directory"));
  CHECK_THAT(parse_error(ws.args({"--tensorboard-log-interval", "0"})),
             Contains("--tensorboard-log-interval must be positive") && Contains(" -- "));
  CHECK_THAT(parse_error(ws.args({"--tensorboard-queue-size", "-1"})),
             Contains("--tensorboard-queue-size must be positive"));
}

}  // namespace troupe
