#include "apps/cli/megatron_compat.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "apps/cli/train_options.hpp"
#include "base/spelling.hpp"
#include "storage/hf_import.hpp"

namespace troupe {
namespace {

enum class Kind { noop, alias, refused, equivalent };

// One flag of Megatron-LM or Megatron-DeepSpeed that troupe does not register. values: how many
// values follow it (0: a switch). ok: for a flag with a value, the values for which it is a no-op
// or alias ("" any; "a|b" those; "0" a number equal to zero); other values make it refused with
// `otherwise`. alias: the troupe flags it stands for (placed first, so a flag given explicitly
// wins). Sources: Megatron-LM megatron/training/arguments.py, Megatron-DeepSpeed
// megatron/arguments.py (the flags' help and their use).
struct Entry {
  const char* flag;
  int values;
  Kind kind;
  const char* text;
  const char* ok = "";
  const char* otherwise = "";
  std::vector<std::string> alias = {};
};

constexpr const char* kFusion = "a kernel fusion: troupe's kernels are its own, the result is the same";
constexpr const char* kWandb =
    "troupe does not write wandb runs: an offline run folder is the wandb package's own record format and an online "
    "run needs wandb's service -- drop the --wandb-* flags and give --tensorboard-dir DIR (Megatron's TensorBoard "
    "tags, which wandb's TensorBoard integration imports) or --metrics-file FILE (every iteration as JSON lines)";
constexpr const char* kFamily =
    "an architecture variant troupe does not build (its families are GPT-2, LLaMA and BLOOM: docs/MODELS.md lists "
    "their flags) -- drop the flag";

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = {
      // Implementation switches: troupe computes the same thing its own way.
      {"--use-flash-attn", 0, Kind::noop, "troupe's attention is its own fused kernel (the same softmax(QK^T)V)"},
      {"--use-flash-attn-v1", 0, Kind::noop, "troupe's attention is its own fused kernel (the same softmax(QK^T)V)"},
      {"--use-flash-attn-v2", 0, Kind::noop, "troupe's attention is its own fused kernel (the same softmax(QK^T)V)"},
      {"--use-flash-attn-triton", 0, Kind::noop, "troupe's attention is its own fused kernel (the same softmax(QK^T)V)"},
      {"--attention-backend", 1, Kind::noop, "troupe's attention is its own fused kernel (the same softmax(QK^T)V)",
       "flash|fused|unfused|local|auto", "Megatron knows flash, fused, unfused, local and auto"},
      {"--transformer-impl", 1, Kind::noop, "troupe's layers are its own (the same GPT-2 block)",
       "local|transformer_engine", "Megatron knows local and transformer_engine"},
      {"--use-mcore-models", 0, Kind::noop, "troupe has one implementation of the model"},
      {"--use-legacy-models", 0, Kind::noop, "troupe has one implementation of the model"},
      {"--no-masked-softmax-fusion", 0, Kind::noop, kFusion},
      {"--no-bias-dropout-fusion", 0, Kind::noop, kFusion},
      {"--no-bias-swiglu-fusion", 0, Kind::noop, kFusion},
      {"--no-rope-fusion", 0, Kind::noop, kFusion},
      {"--no-persist-layer-norm", 0, Kind::noop, kFusion},
      {"--no-gradient-accumulation-fusion", 0, Kind::noop, kFusion},
      {"--no-bias-gelu-fusion", 0, Kind::noop,
       "troupe's GELU is always the tanh form (Megatron's fused bias-GELU and --openai-gelu); without the fusion "
       "Megatron computes the erf form, which differs by less than 1e-3"},
      {"--openai-gelu", 0, Kind::noop, "troupe's GELU is the tanh form this selects"},
      {"--no-async-tensor-model-parallel-allreduce", 0, Kind::noop,
       "an overlap of communication: troupe's tensor-parallel all-reduces give the same sums"},
      {"--async-tensor-model-parallel-allreduce", 0, Kind::noop,
       "an overlap of communication: troupe's tensor-parallel all-reduces give the same sums"},
      {"--overlap-grad-reduce", 0, Kind::noop, "an overlap of communication: the gradients are the same"},
      {"--overlap-param-gather", 0, Kind::noop, "an overlap of communication: the parameters are the same"},
      {"--no-scatter-gather-tensors-in-pipeline", 0, Kind::noop,
       "how pipeline messages travel: troupe sends each activation whole"},
      {"--no-query-key-layer-scaling", 0, Kind::noop,
       "troupe does not scale the query-key product by the layer number (Megatron's default now): the "
       "scaling only reorders fp16 rounding, and --apply-query-key-layer-scaling keeps its fp32 softmax"},
      {"--no-contiguous-buffers-in-local-ddp", 0, Kind::noop, "a memory layout of Megatron's DDP"},
      {"--use-contiguous-buffers-in-local-ddp", 0, Kind::noop, "a memory layout of Megatron's DDP"},
      {"--DDP-impl", 1, Kind::noop, "troupe's data parallelism is its own", "local|torch",
       "Megatron knows local and torch"},
      {"--use-cpu-initialization", 0, Kind::noop, "troupe initialises on the host and the result does not depend on it"},
      {"--empty-unused-memory-level", 1, Kind::noop, "a PyTorch allocator setting"},
      {"--manual-gc", 0, Kind::noop, "a Python garbage-collector setting"},
      {"--check-for-nan-in-loss-and-grad", 0, Kind::noop,
       "troupe always stops on a non-finite gradient norm, naming the iteration (--watch-nan finds the op)"},
      {"--deepspeed-activation-checkpointing", 0, Kind::noop,
       "which library recomputes: troupe recomputes itself as --recompute-granularity says"},
      {"--partition-activations", 0, Kind::noop, "where DeepSpeed keeps recomputation inputs: memory only"},
      {"--contigious-checkpointing", 0, Kind::noop, "where DeepSpeed keeps recomputation inputs: memory only"},
      {"--contiguous-checkpointing", 0, Kind::noop, "where DeepSpeed keeps recomputation inputs: memory only"},
      {"--synchronize-each-layer", 0, Kind::noop, "a DeepSpeed checkpointing debug switch"},
      {"--profile-backward", 0, Kind::noop, "a DeepSpeed checkpointing debug switch"},
      {"--distribute-checkpointed-activations", 0, Kind::noop, "where recomputation inputs are kept: memory only"},
      {"--distribute-saved-activations", 0, Kind::noop, "where recomputation inputs are kept: memory only"},
      {"--recompute-method", 1, Kind::noop,
       "which layers Megatron recomputes with --recompute-granularity full; troupe recomputes every layer of a "
       "chunk: memory only",
       "uniform|block", "Megatron knows uniform and block"},
      {"--recompute-num-layers", 1, Kind::noop, "see --recompute-method: memory only"},
      {"--checkpoint-num-layers", 1, Kind::noop, "see --recompute-method: memory only"},
      {"--no-pipeline-parallel", 0, Kind::noop,
       "Megatron-DeepSpeed's switch off its pipeline engine; troupe's pipeline follows "
       "--pipeline-model-parallel-size"},
      // The process and its data loader.
      {"--distributed-backend", 1, Kind::noop,
       "troupe picks its transport itself (shared memory, UCX or NCCL; troupe info lists them)", "nccl|gloo|ucc|mpi|ccl",
       "Megatron knows nccl, gloo, ucc and mpi"},
      {"--local_rank", 1, Kind::noop, "troupe launch gives each process its rank itself"},  // and --local-rank
      {"--num-workers", 1, Kind::noop, "troupe's loader actor reads the next batch ahead in its own thread"},
      {"--data-impl", 1, Kind::noop, "troupe reads Megatron's mmap .bin/.idx format", "mmap|infer",
       "troupe reads only the mmap format (MMIDIDX): rewrite the data with troupe preprocess"},
      {"--dataloader-type", 1, Kind::noop, "Megatron's default sampler, which troupe's loader reproduces", "single",
       "troupe's loader is Megatron's single sampler: drop the flag"},
      {"--optimizer", 1, Kind::noop, "troupe's optimizer is Megatron's adam (AdamW, decoupled weight decay)",
       "adam|adamw", "troupe trains with AdamW only (Megatron's adam): drop the flag"},
      // TensorBoard switches whose tags troupe has nothing for (the others are troupe's flags).
      {"--log-memory-to-tensorboard", 0, Kind::noop,
       "Megatron writes PyTorch's CUDA caching-allocator counters (mem-*-bytes); troupe has no such allocator, so "
       "no memory tags are written (the run's peak resident memory is printed at its end)"},
      {"--log-optimizer-states-to-tensorboard", 0, Kind::noop,
       "Megatron-DeepSpeed's norms of the Adam moments (optimizer/* tags) are not written: troupe keeps the moments "
       "sharded in its optimizer actors; training is the same"},
      // Precision: --fp16, --bf16 and the loss-scale flags are troupe's own (include/troupe/precision.hpp).
      {"--fp32-residual-connection", 0, Kind::noop, "troupe's residual stream is float32 already"},
      // Other spellings of what troupe does.
      {"--checkpoint-activations", 0, Kind::alias, "Megatron's older spelling of --recompute-granularity full", "", "",
       {"--recompute-granularity", "full"}},
      {"--recompute-activations", 0, Kind::alias, "Megatron's spelling of --recompute-granularity selective", "", "",
       {"--recompute-granularity", "selective"}},
      {"--use-distributed-optimizer", 0, Kind::alias,
       "Megatron's distributed optimizer shards the optimizer state over the data-parallel ranks: troupe's "
       "--zero-stage 1 (the same updates)",
       "", "", {"--zero-stage", "1"}},
      {"--cpu-optimizer", 0, Kind::alias, "the optimizer on the host: troupe's --offload-optimizer cpu", "", "",
       {"--offload-optimizer", "cpu"}},
      // Model families: troupe's own flags now (docs/MODELS.md); these variants it does not build.
      {"--squared-relu", 0, Kind::refused, kFamily},
      {"--apply-layernorm-1p", 0, Kind::refused, kFamily},
      {"--no-load-rng", 0, Kind::noop,
       "troupe keeps no RNG state to load: its random streams are functions of --seed, the iteration and the sample"},
      // Semantics troupe does not have (yet).
      {"--eod-mask-loss", 0, Kind::refused,
       "troupe counts the loss on every token, end-of-document ones included -- drop the flag"},
      {"--reset-position-ids", 0, Kind::refused, "troupe's positions run over the whole sequence -- drop the flag"},
      {"--reset-attention-mask", 0, Kind::refused,
       "troupe's attention spans document boundaries within a sequence -- drop the flag"},
      {"--no-save-optim", 0, Kind::refused, "troupe saves a checkpoint whole, so that it resumes exactly"},
      {"--no-save-rng", 0, Kind::refused, "troupe saves a checkpoint whole, so that it resumes exactly"},
      {"--wandb-project", 1, Kind::refused, kWandb},
      {"--wandb-exp-name", 1, Kind::refused, kWandb},
      {"--wandb-save-dir", 1, Kind::refused, kWandb},
      {"--wandb-entity", 1, Kind::refused, kWandb},
      // Megatron flags troupe lacks, with what to give instead.
      {"--lr-decay-iters-fraction", 1, Kind::equivalent, "give --lr-decay-iters"},
      {"--micro-batch", 1, Kind::equivalent, "--micro-batch-size"},
      {"--batch-size", 1, Kind::equivalent,
       "--micro-batch-size (Megatron's older --batch-size is the micro-batch size)"},
      {"--model-parallel-size", 1, Kind::equivalent, "--tensor-model-parallel-size"},
      {"--warmup", 1, Kind::equivalent, "--lr-warmup-iters (Megatron's older --warmup is a fraction)"},
  };
  return table;
}

std::string normalise(const std::string& flag) {
  std::string s = flag;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

bool is_flag(const std::string& token) { return token.size() > 2 && token.compare(0, 2, "--") == 0; }

bool is_zero(const std::string& v) {
  double x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  return ec == std::errc() && p == v.data() + v.size() && x == 0.0;
}

bool value_ok(const Entry& e, const std::string& v) {
  const std::string ok = e.ok;
  if (ok.empty()) return true;
  if (ok == "0") return is_zero(v);
  size_t start = 0;
  while (start <= ok.size()) {
    const size_t bar = ok.find('|', start);
    if (ok.substr(start, bar == std::string::npos ? std::string::npos : bar - start) == v) return true;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return false;
}

struct Registered {
  std::set<std::string> names;  // "--num-layers", ...
};

Registered registered_flags() {
  TrainConfig cfg;
  CLI::App app{"troupe train"};
  add_train_options(&app, &cfg);
  Registered r;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames()) r.names.insert("--" + n);
  return r;
}

// The nearest spellings of `flag` among registered flags and the table's (at most two), when near.
std::vector<std::string> nearest(const std::string& flag, const Registered& reg) {
  std::vector<std::string> names(reg.names.begin(), reg.names.end());
  for (const Entry& e : entries()) names.push_back(e.flag);
  std::sort(names.begin(), names.end());  // ties: the alphabetically first, as before
  return nearest_spellings(flag, names);
}

std::string last_value(const std::vector<std::string>& args, const std::string& flag) {
  std::string v;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind(flag + "=", 0) == 0) v = args[i].substr(flag.size() + 1);
  }
  return v;
}

// "N problems:\n  - a\n  - b" (validation's) as its items; any other message as one.
void append_problems(std::vector<std::string>& problems, const std::string& message) {
  const std::string sep = "\n  - ";
  if (message.find(" problems:" + sep) == std::string::npos) {
    problems.push_back(message);
    return;
  }
  size_t at = message.find(sep);
  while (at != std::string::npos) {
    const size_t next = message.find(sep, at + sep.size());
    problems.push_back(message.substr(at + sep.size(), next == std::string::npos ? std::string::npos : next - at - sep.size()));
    at = next;
  }
}

// Megatron's --load of a folder that holds no checkpoint (missing, or empty: the first run of a
// script that passes --save X --load X) warns and starts from scratch; so does troupe, with a note.
// A folder with iter_* entries but no latest_checkpointed_iteration.txt stays an error
// (validation's): an unfinished save is not a fresh start. --exit-on-missing-checkpoint keeps
// Megatron's exit instead.
void fresh_start_if_nothing_to_load(std::vector<std::string>& args, std::vector<std::string>& notes) {
  namespace fs = std::filesystem;
  const std::string load = last_value(args, "--load");
  if (load.empty()) return;
  for (const std::string& a : args)
    if (a == "--exit-on-missing-checkpoint") return;
  std::error_code ec;
  const fs::file_status st = fs::status(load, ec);
  bool nothing = false;
  if (st.type() == fs::file_type::not_found) {
    nothing = true;
  } else if (st.type() == fs::file_type::directory) {
    nothing = !fs::exists(fs::path(load) / "latest_checkpointed_iteration.txt", ec) && !is_hf_folder(load);
    for (fs::directory_iterator it(load, ec), end; nothing && !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind("iter_", 0) == 0) nothing = false;
  }
  if (!nothing) return;
  std::vector<std::string> kept;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--load" && i + 1 < args.size()) {
      ++i;
      continue;
    }
    if (args[i].rfind("--load=", 0) == 0) continue;
    kept.push_back(args[i]);
  }
  args = std::move(kept);
  notes.push_back("--load " + load + ": no checkpoint there yet, so training starts from scratch (as Megatron does; "
                  "--exit-on-missing-checkpoint stops instead)");
}

}  // namespace

size_t flag_distance(const std::string& a, const std::string& b) { return spelling_distance(a, b); }

std::vector<CompatRow> compat_table() {
  std::vector<CompatRow> rows;
  for (const Entry& e : entries()) {
    const char* kind = e.kind == Kind::noop      ? "no-op"
                       : e.kind == Kind::alias   ? "alias"
                       : e.kind == Kind::refused ? "refused"
                                                 : "equivalent";
    rows.push_back({e.flag, kind, e.text});
  }
  return rows;
}

Result<ScreenedTrainArgs> screen_train_args(const std::vector<std::string>& args, int world_size) {
  const Registered reg = registered_flags();
  std::map<std::string, const Entry*> table;
  for (const Entry& e : entries()) table.emplace(normalise(e.flag), &e);
  ScreenedTrainArgs out;
  std::vector<std::string> front;  // the aliases' flags: first, so that explicit flags win
  std::vector<std::string> problems;
  std::set<std::string> noted;
  for (size_t i = 0; i < args.size();) {
    const std::string& token = args[i];
    if (!is_flag(token)) {  // a value of a registered flag, or a stray word CLI11 reports
      out.args.push_back(token);
      ++i;
      continue;
    }
    const size_t eq = token.find('=');
    const std::string flag = token.substr(0, eq);
    std::optional<std::string> inline_value;
    if (eq != std::string::npos) inline_value = token.substr(eq + 1);
    // The values that follow this flag: up to the next flag.
    size_t next = i + 1;
    while (next < args.size() && !is_flag(args[next])) ++next;
    if (reg.names.count(flag) > 0) {
      out.args.insert(out.args.end(), args.begin() + static_cast<std::ptrdiff_t>(i),
                      args.begin() + static_cast<std::ptrdiff_t>(next));
      i = next;
      continue;
    }
    const auto it = table.find(normalise(flag));
    if (it == table.end()) {
      const std::vector<std::string> near = nearest(flag, reg);
      std::string p = flag + ": not a flag of troupe train";
      if (!near.empty()) p += " -- did you mean " + near[0] + (near.size() > 1 ? " or " + near[1] : "") + "?";
      else p += " -- troupe train --help lists the flags, docs/COMPAT.md Megatron's and DeepSpeed's";
      problems.push_back(p);
      i = next;
      continue;
    }
    const Entry& e = *it->second;
    // The entry's values: inline (--flag=v) or the tokens that follow.
    std::vector<std::string> values;
    if (inline_value) values.push_back(*inline_value);
    size_t j = i + 1;
    while (static_cast<int>(values.size()) < e.values && j < args.size() && !is_flag(args[j])) values.push_back(args[j++]);
    if (static_cast<int>(values.size()) < e.values) {
      problems.push_back(fmt::format("{}: needs {} value(s)", flag, e.values));
      i = j;
      continue;
    }
    if (e.kind == Kind::refused || e.kind == Kind::equivalent) {
      problems.push_back(flag + ": " + e.text);
      i = j;
      continue;
    }
    if (!values.empty() && !value_ok(e, values[0])) {
      problems.push_back(flag + " " + values[0] + ": " + e.otherwise);
      i = j;
      continue;
    }
    if (noted.insert(e.flag).second) {
      std::string note = flag + (values.empty() ? "" : " " + values[0]) + ": ";
      if (e.kind == Kind::alias) {
        std::string as;
        for (const std::string& a : e.alias) as += (as.empty() ? "" : " ") + a;
        note += "read as " + as + " -- " + e.text;
      } else {
        note += "no effect -- " + std::string(e.text);
      }
      out.notes.push_back(note);
    }
    if (e.kind == Kind::alias) front.insert(front.end(), e.alias.begin(), e.alias.end());
    i = j;
  }
  out.args.insert(out.args.begin(), front.begin(), front.end());
  fresh_start_if_nothing_to_load(out.args, out.notes);
  if (problems.empty()) return out;
  // Everything else wrong too, so that one run lists it all: the first value CLI11 cannot read,
  // or else validation's problems.
  TrainConfig cfg;
  CLI::App app{"troupe train"};
  add_train_options(&app, &cfg);
  std::vector<std::string> reversed(out.args.rbegin(), out.args.rend());
  try {
    app.parse(reversed);
    if (Status st = finalize_train_config(app, &cfg, world_size); !st) append_problems(problems, st.message());
  } catch (const CLI::CallForHelp&) {
  } catch (const CLI::ParseError& e) {
    problems.push_back(e.what());
  }
  std::string message = problems.size() == 1 ? problems[0] : fmt::format("{} problems with the flags:", problems.size());
  if (problems.size() > 1)
    for (const std::string& p : problems) message += "\n  - " + p;
  return Status::bad_input(message);
}

}  // namespace troupe
