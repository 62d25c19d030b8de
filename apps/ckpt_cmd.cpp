// `troupe ckpt info DIR`, `troupe ckpt convert`, `troupe ckpt export --load DIR --format hf --output
// HF_DIR` (or --format hf-h5 --output F.h5) and `troupe ckpt import --format hf --input HF_DIR --save DIR`.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/commands.hpp"
#include "config/imported_config.hpp"
#include "config/run_identity.hpp"
#include "engine/checkpoint_convert.hpp"
#include "storage/checkpoint.hpp"
#include "storage/hf_export.hpp"
#include "storage/hf_import.hpp"
#include "storage/sharded_checkpoint.hpp"

namespace troupe::apps {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct InfoArgs {
  std::string dir;
  int64_t iteration = -1;  // -1: latest
  bool json = false;
};

struct ExportArgs {
  std::string load;
  int64_t iteration = -1;
  std::string format = "hf";
  std::string output;
};

struct ImportArgs {
  std::string format = "hf";
  std::string input, save;
};

struct ConvertArgs {
  std::string load, save;
  int64_t iteration = -1;
  ConvertTarget target;
};

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "troupe ckpt: error: %s\n", message.c_str());
  return code;
}

// Usage problems shared by both subcommands; an empty string when the arguments can be used.
std::string usage_problem(const std::string& dir, int64_t iteration) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return "checkpoint directory " + dir + " does not exist -- pass the directory given to --save";
  if (iteration < -1)
    return "--iteration " + std::to_string(iteration) + " is negative -- pass a saved iteration";
  return "";
}

Result<int64_t> resolve_iteration(const std::string& dir, int64_t iteration) {
  if (iteration >= 0) return iteration;
  return latest_iteration(dir);
}

// "4 layers, hidden 256, 4 heads, seq 256, positions 256, vocab 50257" from the config's "model"
// keys.
std::string model_summary(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("model") || !config["model"].is_object())
    return "(no model section in the stored config)";
  const nlohmann::json& m = config["model"];
  std::string out;
  for (auto [key, label] :
       {std::pair{"num_layers", " layers"}, std::pair{"hidden_size", "hidden "},
        std::pair{"num_attention_heads", " heads"}, std::pair{"seq_length", "seq "},
        std::pair{"max_position_embeddings", "positions "}, std::pair{"vocab_size", "vocab "}}) {
    if (!m.contains(key)) continue;
    const std::string v = m[key].dump();
    const std::string l = label;
    out += (out.empty() ? "" : ", ") + (l.front() == ' ' ? v + l : l + v);
  }
  return out.empty() ? "(model section is empty)" : out;
}

nlohmann::json parse_or_string(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(text) : j;
}

int run_info(const InfoArgs& a) {
  if (std::string p = usage_problem(a.dir, a.iteration); !p.empty()) return fail(kExitUsage, p);
  Result<int64_t> it = resolve_iteration(a.dir, a.iteration);
  // Everything read here is the checkpoint the user named: a failure is bad input (exit 2).
  if (!it) return fail(kExitUsage, it.status().message());
  Result<Checkpoint> checkpoint = Checkpoint::open(a.dir, *it);
  if (!checkpoint) return fail(kExitUsage, checkpoint.status().message());
  const CheckpointMeta* meta = &checkpoint->meta();
  Result<std::vector<CheckpointTensorInfo>> tensors = checkpoint->tensors();
  if (!tensors) return fail(kExitUsage, tensors.status().message());
  // Where it lies (the iteration directory, or version 1's one file) and its bytes on disk.
  const std::string& file = checkpoint->location();
  const uint64_t file_bytes = checkpoint->bytes();
  const bool sharded = !meta->layout_json.empty();
  const nlohmann::json config = parse_or_string(meta->config_json);
  int64_t model_numel = 0, optimizer_numel = 0;
  for (const CheckpointTensorInfo& t : *tensors)
    (t.path.rfind("model/", 0) == 0 ? model_numel : optimizer_numel) += t.shape.numel();
  const double model_mib = static_cast<double>(model_numel) * sizeof(float) / kMiB;
  const double optimizer_mib = static_cast<double>(optimizer_numel) * sizeof(float) / kMiB;

  if (a.json) {
    nlohmann::json j;
    j["file"] = file;
    j["file_bytes"] = file_bytes;
    j["format_version"] = meta->format_version;
    if (sharded) j["layout"] = parse_or_string(meta->layout_json);
    j["iteration"] = meta->iteration;
    j["consumed_samples"] = meta->consumed_samples;
    j["optimizer_step"] = meta->optimizer_step;
    j["config"] = config;
    j["rng"] = parse_or_string(meta->rng_json);
    j["tensors"] = nlohmann::json::array();
    for (const CheckpointTensorInfo& t : *tensors)
      j["tensors"].push_back(
          {{"name", t.path},
           {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
           {"numel", t.shape.numel()},
           {"mib", static_cast<double>(t.shape.numel()) * sizeof(float) / kMiB}});
    j["totals"] = {{"model_numel", model_numel},
                   {"model_mib", model_mib},
                   {"optimizer_numel", optimizer_numel},
                   {"optimizer_mib", optimizer_mib},
                   {"total_mib", model_mib + optimizer_mib}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }

  std::printf("checkpoint        %s (%.2f MiB on disk)\n", file.c_str(),
              static_cast<double>(file_bytes) / kMiB);
  std::printf("format            troupe-checkpoint version %d\n", meta->format_version);
  if (sharded) std::printf("saved by layout   %s\n", meta->layout_json.c_str());
  std::printf("iteration         %lld\n", static_cast<long long>(meta->iteration));
  std::printf("consumed samples  %lld\n", static_cast<long long>(meta->consumed_samples));
  std::printf("optimizer step    %lld\n", static_cast<long long>(meta->optimizer_step));
  std::printf("model             %s\n", model_summary(config).c_str());
  size_t width = 4;
  for (const CheckpointTensorInfo& t : *tensors) width = std::max(width, t.path.size());
  std::printf("\n  %-*s  %-16s %12s %10s\n", static_cast<int>(width), "name", "shape", "elements",
              "MiB");
  for (const CheckpointTensorInfo& t : *tensors)
    std::printf("  %-*s  %-16s %12lld %10.3f\n", static_cast<int>(width), t.path.c_str(),
                t.shape.str().c_str(), static_cast<long long>(t.shape.numel()),
                static_cast<double>(t.shape.numel()) * sizeof(float) / kMiB);
  std::printf("\nmodel             %lld parameters, %.2f MiB\n",
              static_cast<long long>(model_numel), model_mib);
  std::printf("optimizer state   %lld values, %.2f MiB\n", static_cast<long long>(optimizer_numel),
              optimizer_mib);
  std::printf("total             %.2f MiB\n", model_mib + optimizer_mib);
  return kExitOk;
}

int run_export(const ExportArgs& a) {
  if (a.format != "hf" && a.format != "hf-h5")
    return fail(kExitUsage, "--format '" + a.format +
                                "' is not supported -- use --format hf (a Hugging Face folder) or hf-h5 (one HDF5 file)");
  const bool h5_name = a.output.size() > 3 && a.output.compare(a.output.size() - 3, 3, ".h5") == 0;
  if (a.format == "hf" && h5_name)
    return fail(kExitUsage, "--format hf writes a folder (config.json, model.safetensors, ...), but --output " + a.output +
                                " names an HDF5 file -- pass --format hf-h5 for the HDF5 state dict, or a folder");
  if (std::string p = usage_problem(a.load, a.iteration); !p.empty()) return fail(kExitUsage, p);
  Result<int64_t> it = resolve_iteration(a.load, a.iteration);
  if (!it) return fail(kExitUsage, it.status().message());
  Result<Checkpoint> checkpoint = Checkpoint::open(a.load, *it);
  if (!checkpoint) return fail(exit_code_for(checkpoint.status()), checkpoint.status().message());
  // The run's model decides the Hugging Face class; a config that does not parse or validate (older,
  // foreign or damaged checkpoints) leaves the GPT-2 export, which derives everything from the tensors.
  HfArch arch;
  if (Result<TrainConfig> run = TrainConfig::from_json(checkpoint->meta().config_json);
      run && run->model.validate().is_ok()) {
    Result<HfArch> of = hf_arch_of(run->model);
    if (!of) return fail(kExitUsage, "exporting checkpoint " + checkpoint->location() + ": " + of.status().message());
    arch = *of;
  }
  if (a.format == "hf-h5" && arch.family != HfFamily::gpt2)
    return fail(kExitUsage, std::string("--format hf-h5 holds GPT2LMHeadModel state dicts only; the checkpoint is a ") +
                                hf_architecture(arch.family) + " -- export it with --format hf (a folder)");
  const Status st = a.format == "hf" ? export_hf_folder(*checkpoint, a.output, arch) : export_hf(*checkpoint, a.output);
  if (!st) return fail(exit_code_for(st), st.message());
  const std::string what = a.format == "hf" ? std::string("a Hugging Face folder: ") + hf_architecture(arch.family) +
                                                  ".from_pretrained reads it"
                                            : std::string("Hugging Face GPT2LMHeadModel state dict, HDF5");
  std::printf("exported iteration %lld of %s to %s (%s)\n", static_cast<long long>(*it), a.load.c_str(),
              a.output.c_str(), what.c_str());
  return kExitOk;
}

// A troupe checkpoint at iteration 0 holding the folder's weights, with a fresh run id; --save must
// not hold a checkpoint yet.
int run_import(const ImportArgs& a) {
  if (a.format != "hf")
    return fail(kExitUsage, "--format '" + a.format + "' is not supported -- use --format hf (a Hugging Face folder)");
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(a.save) / "latest_checkpointed_iteration.txt", ec))
    return fail(kExitUsage, "--save " + a.save + " already holds checkpoints -- import into an empty (or new) folder");
  Result<HfModel> model = read_hf_folder(a.input);
  if (!model) return fail(exit_code_for(model.status()), model.status().message());
  const TrainConfig config = imported_train_config(*model);
  CheckpointMeta meta;
  meta.config_json = config.to_json();
  meta.rng_json = "{\"seed\": " + std::to_string(config.seed) + ", \"consumed_samples\": 0}";
  meta.run_json = run_json(new_run_id());
  if (Status st = write_hf_checkpoint(*model, a.save, meta); !st) return fail(exit_code_for(st), st.message());
  const HfGpt2Config& c = model->config;
  std::printf("imported %s (%s) to %s (iteration 0): %lld layers, hidden %lld, %lld heads, positions %lld, vocab %lld, "
              "tokenizer %s%s\n",
              a.input.c_str(), hf_architecture(c.arch.family), iteration_dir(a.save, 0).c_str(),
              static_cast<long long>(c.n_layer),
              static_cast<long long>(c.n_embd), static_cast<long long>(c.n_head), static_cast<long long>(c.n_positions),
              static_cast<long long>(c.vocab_size), config.tokenizer_type.c_str(),
              model->vocab_file.empty() ? "" : " (the folder's vocab.json and merges.txt)");
  return kExitOk;
}

int run_convert(const ConvertArgs& a) {
  if (std::string p = usage_problem(a.load, a.iteration); !p.empty()) return fail(kExitUsage, p);
  std::error_code ec;
  if (std::filesystem::equivalent(a.load, a.save, ec))
    return fail(kExitUsage, "--save " + a.save + " is the --load directory -- write the converted checkpoint elsewhere");
  Result<int64_t> it = resolve_iteration(a.load, a.iteration);
  if (!it) return fail(kExitUsage, it.status().message());
  Result<int> ep = convert_checkpoint(a.load, *it, a.save, a.target);
  if (!ep) return fail(exit_code_for(ep.status()), ep.status().message());
  std::printf("converted iteration %lld of %s to %s: tensor %d x pipeline %d x data %d%s, ZeRO %d (%d shard files)\n",
              static_cast<long long>(*it), a.load.c_str(), a.save.c_str(), a.target.tp, a.target.pp, a.target.dp,
              *ep > 1 ? (" (expert-parallel " + std::to_string(*ep) + ")").c_str() : "", a.target.zero_stage,
              a.target.tp * a.target.pp * a.target.dp);
  return kExitOk;
}

}  // namespace

void add_ckpt_command(CLI::App& app, int* exit_code) {
  CLI::App* ckpt =
      app.add_subcommand("ckpt", "Inspect, convert (reshard), export and import checkpoints");
  ckpt->require_subcommand(1, 1);

  auto info_args = std::make_shared<InfoArgs>();
  CLI::App* info =
      ckpt->add_subcommand("info", "Print a checkpoint's metadata, config and tensors");
  info->add_option("DIR", info_args->dir, "Checkpoint directory (the one given to --save)")
      ->required();
  info->add_option("--iteration", info_args->iteration,
                   "Iteration to inspect (default: the latest)");
  info->add_flag("--json", info_args->json, "Print one JSON object instead of text");
  info->callback([info_args, exit_code] { *exit_code = run_info(*info_args); });

  auto export_args = std::make_shared<ExportArgs>();
  CLI::App* exp = ckpt->add_subcommand("export", "Write a checkpoint's model in another format");
  exp->add_option("--load", export_args->load, "Checkpoint directory")->required();
  exp->add_option("--iteration", export_args->iteration,
                  "Iteration to export (default: the latest)");
  exp->add_option("--format", export_args->format,
                  "Output format: hf (the folder GPT2LMHeadModel.from_pretrained loads: config.json, "
                  "model.safetensors, ...) or hf-h5 (its state dict in one HDF5 file)")
      ->capture_default_str();
  exp->add_option("--output", export_args->output, "Output folder (hf) or HDF5 file (hf-h5)")->required();
  exp->callback([export_args, exit_code] { *exit_code = run_export(*export_args); });

  auto import_args = std::make_shared<ImportArgs>();
  CLI::App* imp = ckpt->add_subcommand(
      "import", "Write a Hugging Face GPT-2 folder's weights as a troupe checkpoint (iteration 0) to train from");
  imp->add_option("--format", import_args->format, "Input format: hf (a save_pretrained folder)")->capture_default_str();
  imp->add_option("--input", import_args->input, "The Hugging Face folder (config.json, model.safetensors)")
      ->required();
  imp->add_option("--save", import_args->save, "Directory to write the checkpoint to (empty or new)")->required();
  imp->callback([import_args, exit_code] { *exit_code = run_import(*import_args); });

  auto convert_args = std::make_shared<ConvertArgs>();
  CLI::App* conv = ckpt->add_subcommand(
      "convert", "Reshard a checkpoint offline for another layout (--load reshards by itself too)");
  conv->add_option("--load", convert_args->load, "Checkpoint directory to read")->required();
  conv->add_option("--save", convert_args->save, "Directory to write the converted checkpoint to")->required();
  conv->add_option("--iteration", convert_args->iteration, "Iteration to convert (default: the latest)");
  conv->add_option("--target-tensor-parallel-size", convert_args->target.tp, "Tensor-parallel size")
      ->capture_default_str();
  conv->add_option("--target-pipeline-parallel-size", convert_args->target.pp, "Pipeline-parallel size")
      ->capture_default_str();
  conv->add_option("--target-data-parallel-size", convert_args->target.dp, "Data-parallel size")
      ->capture_default_str();
  conv->add_option("--target-zero-stage", convert_args->target.zero_stage, "ZeRO stage (partitions of the shards)")
      ->capture_default_str();
  conv->add_option("--target-expert-model-parallel-size", convert_args->target.ep,
                   "Expert-parallel size, of the data-parallel ranks (MoE models; default: the checkpoint's, "
                   "where the target's data-parallel size holds it, else 1)");
  conv->callback([convert_args, exit_code] { *exit_code = run_convert(*convert_args); });
}

}  // namespace troupe::apps
