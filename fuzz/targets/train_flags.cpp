// The `troupe train` command line: one argument per line of the input, screened for Megatron's and
// DeepSpeed's flags (apps/cli/megatron_compat.hpp), then parsed by CLI11 as main()
// parses it (require one subcommand; a CLI::ParseError is the usage error main prints), then merged
// and validated by finalize_train_config, then the model check, the memory check and the figures
// train prints -- everything before training allocates anything, which never happens here.
//
// An optional first line "world=N" (1 to 4096) runs it as one of N ranks under troupe launch. Lines
// starting with a fixture's name have it replaced by its path: @DS (docs/examples/ds_config.json),
// @DATA (a tiny dataset prefix in fuzz/data), @VOCAB / @MERGES (fuzz/data/gpt2_tiny), @DIR (an
// empty scratch directory, for --save, --load and --offload-path).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "config/memory_estimate.hpp"
#include "apps/cli/megatron_compat.hpp"
#include "apps/cli/train_options.hpp"
#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"

namespace troupe::fuzz {
namespace {

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size() && out.size() < 512) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  if (!out.empty() && out.back().empty()) out.pop_back();  // a final newline
  return out;
}

// An argument starting with a fixture's name, with the name replaced by its path.
std::string fixture(const std::string& arg) {
  const std::pair<const char*, std::string> fixtures[] = {
      {"@DS", source_path("docs/examples/ds_config.json")},
      {"@DATA", source_path("fuzz/data/tiny_text_document")},
      {"@VOCAB", source_path("fuzz/data/gpt2_tiny/encoder.json")},
      {"@MERGES", source_path("fuzz/data/gpt2_tiny/vocab.bpe")},
      {"@DIR", scratch_dir()}};
  for (const auto& [name, path] : fixtures)
    if (arg.rfind(name, 0) == 0) return path + arg.substr(std::string_view(name).size());
  return arg;
}

}  // namespace

Status train_flags(const uint8_t* data, size_t size) {
  std::vector<std::string> args =
      lines_of(std::string_view(reinterpret_cast<const char*>(data), size));
  int world_size = 1;
  if (!args.empty() && args[0].rfind("world=", 0) == 0) {
    const std::string n = args[0].substr(6);
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos)
      return Status::error("world= needs 1 to 4096");
    world_size = std::stoi(n);
    if (world_size < 1 || world_size > 4096) return Status::error("world= needs 1 to 4096");
    args.erase(args.begin());
  }
  // main's order: Megatron's and DeepSpeed's flags screened first (apps/cli/megatron_compat.hpp).
  for (std::string& a : args) a = fixture(a);
  auto screened = screen_train_args(args, world_size);
  if (!screened) return screened.status();
  std::vector<std::string> argv_text = {"troupe", "train"};
  for (const std::string& a : screened.value().args) argv_text.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());

  CLI::App app{"troupe"};
  app.require_subcommand(1, 1);
  TrainConfig config;
  CLI::App* cmd = app.add_subcommand("train", "");
  add_train_options(cmd, &config);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return Status::error(std::string("usage: ") + e.what());
  }
  // What run_train does next (apps/train_cmd.cpp), up to the first allocation: the vocabulary, the
  // model's own check, the memory check (against a fixed 64 GiB, so that runs repeat), then the
  // figures it prints.
  TROUPE_RETURN_IF_ERROR(finalize_train_config(*cmd, &config, world_size));
  config.model.vocab_size = 50257;
  TROUPE_RETURN_IF_ERROR(config.model.validate());
  TROUPE_RETURN_IF_ERROR(check_memory(config, world_size, 1, 64.0 * (1 << 30)));
  (void)config.model.num_parameters();
  (void)config.model.padded_vocab_size(1);
  (void)config.model.flops_per_iteration(int64_t{config.global_batch_size} *
                                         config.model.seq_length);
  (void)config.grad_accumulation_steps(world_size);
  return Status::ok();
}

}  // namespace troupe::fuzz
