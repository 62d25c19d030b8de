// validate_train_config and validate_world (config/validate.hpp): every setting of a TrainConfig
// checked before anything runs, each message naming the flag (or the DeepSpeed key it came from)
// and the fix.
#include "config/validate.hpp"

#include <fmt/format.h>
#include <unistd.h>  // access(W_OK): whether --save could be created later

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "storage/data_blend.hpp"
#include "storage/gpt_dataset.hpp"
#include "storage/hf_import.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// For each flag whose value came from the DeepSpeed file: which key, in which file. Validation adds
// it to its message so the user fixes the file, not a flag they never passed.
using Origins = FlagOrigins;

// "a, b or c".
std::string join_with(const std::vector<std::string>& items, const std::string& last_separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? last_separator : ", ") + items[i];
  return out;
}

// -------------------------------------------------------------------------------------------------
// Validation. Each message: the flag, what is wrong, where the value came from if it was the file,
// then " -- " and the fix. Every area reports all of its problems; a check whose arithmetic needs
// another setting to be valid (a division by the micro-batch size, say) runs only once that one is.
// -------------------------------------------------------------------------------------------------

// The problems found so far, in order.
class Problems {
 public:
  // Records a failed check; returns whether it passed.
  bool check(const Status& st) {
    if (!st.is_ok()) items_.push_back(st.message());
    return st.is_ok();
  }
  size_t size() const { return items_.size(); }
  const std::vector<std::string>& items() const { return items_; }

 private:
  std::vector<std::string> items_;
};

class Validator {
 public:
  explicit Validator(const Origins* origins, GivenInCode given = {}, int world_size = 1)
      : origins_(origins), given_(given), world_size_(world_size) {}

  // Every problem at once (one run shows what to fix). The batch rules divide by the model's and the
  // layout's numbers, so they are checked only once those are valid.
  Status run(const TrainConfig& c) const {
    Problems p;
    bool model_ok = true;
    if (given_.model_without_gpt_layers) {
      model_ok = p.check(positive("--seq-length", c.model.seq_length, "256"));
    } else {
      model_ok = model_sizes(c.model, p);
      if (model_ok)
        for (const std::string& problem : c.model.architecture_problems())
          model_ok = p.check(Status::error(problem)) && model_ok;
    }
    const bool shape = parallel(c, model_ok, p) && model_ok;
    if (!given_.model_without_gpt_layers) experts(c, p);
    if (shape) batch(c, p);
    optimizer(c, p);
    precision(c, p);
    schedule(c, p);
    data(c, p);
    checkpoints(c, p);
    offload_and_restarts(c, p);
    device(c, p);
    logging(c, p);
    if (p.size() == 0) return Status::ok();
    if (p.size() == 1) return Status::error(p.items()[0]);
    std::string message = fmt::format("{} problems:", p.size());
    for (const std::string& item : p.items()) message += "\n  - " + item;
    return Status::error(message);
  }

  // validate_world's checks; see its declaration.
  Status world(const TrainConfig& c, int world_size) const {
    if (world_size < 1)
      return Status::error(fmt::format(
          "troupe launch reported {} ranks -- start at least one (--nproc-per-node)", world_size));
    Problems sizes_ok;
    if (!sizes(c, sizes_ok)) return Status::error(sizes_ok.items()[0]);  // so that the arithmetic below is defined
    TROUPE_RETURN_IF_ERROR(positive("--micro-batch-size", c.micro_batch_size, "4"));
    const int tp = c.tensor_model_parallel_size, pp = c.pipeline_model_parallel_size, cp = c.sequence_ranks();
    const int dp = c.resolved_dp(world_size);
    const int64_t model_parallel = int64_t{tp} * pp * cp;
    const int64_t needed = model_parallel * dp;
    if (needed != world_size) {
      const std::string dp_text =
          c.data_parallel_size > 0 ? fmt::format("--data-parallel-size {}", dp)
                                   : fmt::format("data-parallel {} (derived from the ranks)", dp);
      std::string fix;
      if (world_size % model_parallel == 0)
        fix = fmt::format(
            "set --data-parallel-size {} (or leave it out to derive it) or start "
            "{} ranks",
            world_size / model_parallel, needed);
      else
        fix = fmt::format(
            "start a multiple of --tensor-model-parallel-size x "
            "--pipeline-model-parallel-size{} = {} ranks (e.g. {}), or change those "
            "sizes",
            cp > 1 ? (c.ds_sequence_parallel_size > 1 ? " x --ds-sequence-parallel-size" : " x --context-parallel-size")
                   : "",
            model_parallel, needed);
      return bad("--tensor-model-parallel-size",
                 fmt::format("{} x --pipeline-model-parallel-size {}{} x {} = {} ranks, but troupe "
                             "launch started {}",
                             tp, pp,
                             cp > 1 ? fmt::format(" x --{}-parallel-size {}",
                                                  c.ds_sequence_parallel_size > 1 ? "ds-sequence" : "context", cp)
                                    : std::string(),
                             dp_text, needed, world_size),
                 fix);
    }
    return batch_divisible(c, dp, fmt::format(" (troupe launch started {} ranks)", world_size));
  }

 private:
  Status bad(const std::string& flag, const std::string& what, const std::string& fix) const {
    std::string message = flag + " " + what;
    if (origins_) {
      if (const auto it = origins_->find(flag); it != origins_->end())
        message += " (the value comes from " + it->second + ": fix it there)";
    }
    return Status::error(message + " -- " + fix);
  }

  template <class T>
  Status positive(const std::string& flag, T value, const std::string& example) const {
    if (value > 0) return Status::ok();
    return bad(flag, fmt::format("must be positive, got {}", value),
               "pass e.g. " + flag + " " + example);
  }

  // The sizes every other check divides by; the rest of the architecture, every problem at once,
  // is GptConfig::architecture_problems (include/troupe/model_config.hpp). Returns whether all hold.
  bool model_sizes(const GptConfig& m, Problems& p) const {
    bool ok = p.check(positive("--num-layers", m.num_layers, "4"));
    ok = p.check(positive("--hidden-size", m.hidden_size, "256")) && ok;
    ok = p.check(positive("--num-attention-heads", m.num_attention_heads, "4")) && ok;
    ok = p.check(positive("--seq-length", m.seq_length, "256")) && ok;
    return ok;
  }

  void batch(const TrainConfig& c, Problems& p) const {
    if (!p.check(positive("--micro-batch-size", c.micro_batch_size, "4"))) return;
    const bool ramp_ok = p.check(rampup(c));
    // In one process; under troupe launch validate_world checks the dp the ranks give.
    if (ramp_ok) p.check(batch_divisible(c, c.resolved_dp(1), ""));
    if (c.train_iters <= 0 && c.train_samples <= 0 && c.train_tokens <= 0)
      p.check(bad("--train-iters", fmt::format("must be positive, got {}", c.train_iters),
                  "give --train-iters N (or Megatron's --train-samples, Megatron-DeepSpeed's --train-tokens)"));
    else if (c.train_iters <= 0)
      p.check(bad(c.train_samples > 0 ? "--train-samples" : "--train-tokens",
                  fmt::format("gives no whole iteration of --global-batch-size {}", c.global_batch_size),
                  "train for at least one global batch"));
  }

  // Megatron's --rampup-batch-size (RampupBatchsizeNumMicroBatchesCalculator's assertions, and its
  // consistency check at every iteration: each batch of the ramp splits into whole micro-batches
  // per replica, i.e. START and INCREMENT are multiples of micro x dp). Megatron's validate_args
  // also refuses a ramp-up in an iteration-based run, which its own
  // examples/gpt3/train_gpt3_175b_distributed.sh asks for; troupe runs it (a start-up note says so).
  // One problem at most: each rule presumes the ones before it.
  static constexpr int64_t kMaxRampIterations = 100'000'000;
  Status rampup(const TrainConfig& c) const {
    if (!c.rampup() && c.rampup_batch_increment == 0 && c.rampup_samples == 0) return Status::ok();
    if (c.rampup_start_batch <= 0 || c.rampup_batch_increment <= 0 || c.rampup_samples < 0)
      return bad("--rampup-batch-size",
                 fmt::format("is {} {} {}; START and INCREMENT must be positive, SAMPLES >= 0", c.rampup_start_batch,
                             c.rampup_batch_increment, c.rampup_samples),
                 "give e.g. --rampup-batch-size 16 16 5859375 (start, increment, ramp-up samples)");
    if (c.rampup_samples / c.rampup_start_batch > kMaxRampIterations)
      return bad("--rampup-batch-size",
                 fmt::format("ramps up over {} samples from batches of {}: more than {} iterations", c.rampup_samples,
                             c.rampup_start_batch, kMaxRampIterations),
                 "start from a larger batch or ramp over fewer samples");
    const int64_t diff = c.global_batch_size - c.rampup_start_batch;
    if (diff < 0 || diff % c.rampup_batch_increment != 0)
      return bad("--rampup-batch-size",
                 fmt::format("starts at {}, which does not reach --global-batch-size {} in steps of {}",
                             c.rampup_start_batch, c.global_batch_size, c.rampup_batch_increment),
                 "make --global-batch-size - START a multiple of INCREMENT (and START <= --global-batch-size)");
    return Status::ok();
  }

  Status rampup_divisible(const TrainConfig& c, int64_t step, const std::string& ranks) const {
    if (!c.rampup() || c.rampup_batch_increment <= 0) return Status::ok();
    if (c.rampup_start_batch % step == 0 && c.rampup_batch_increment % step == 0) return Status::ok();
    return bad("--rampup-batch-size",
               fmt::format("{} {} {}: its batches are not all multiples of --micro-batch-size {} x the data-parallel "
                           "size ({}){}",
                           c.rampup_start_batch, c.rampup_batch_increment, c.rampup_samples, c.micro_batch_size, step,
                           ranks),
               fmt::format("make START and INCREMENT multiples of {}", step));
  }

  // The global batch splits into whole micro-batches on each of `dp` data-parallel replicas.
  // `ranks`: appended to the message when the dp comes from troupe launch.
  Status batch_divisible(const TrainConfig& c, int dp, const std::string& ranks) const {
    const int64_t step = int64_t{c.micro_batch_size} * dp;
    if (c.global_batch_size > 0 && c.global_batch_size % step == 0) return rampup_divisible(c, step, ranks);
    if (dp == 1)
      return bad("--global-batch-size",
                 fmt::format("{} is not a positive multiple of --micro-batch-size {}",
                             c.global_batch_size, c.micro_batch_size),
                 "make it micro batch size times the gradient accumulation steps");
    const int64_t example = std::max<int64_t>(1, (c.global_batch_size + step - 1) / step) * step;
    return bad("--global-batch-size",
               fmt::format("{} is not a positive multiple of --micro-batch-size {} x {} = {}{}",
                           c.global_batch_size, c.micro_batch_size,
                           ranks.empty() ? fmt::format("--data-parallel-size {}", dp)
                                         : fmt::format("data-parallel size {}", dp),
                           step, ranks),
               fmt::format("make it micro batch size x data-parallel size x the gradient "
                           "accumulation steps, e.g. {}",
                           example));
  }

  // Tensor, pipeline and data parallelism, ZeRO, recomputation. Megatron's rules
  // (megatron/training/arguments.py) unless a comment says otherwise. The rules that split the model
  // run only when its sizes hold (model_ok). Returns whether the layout holds (the batch rules divide
  // by it).
  bool parallel(const TrainConfig& c, bool model_ok, Problems& p) const {
    const size_t before = p.size();
    const GptConfig& m = c.model;
    const int tp = c.tensor_model_parallel_size;
    if (sizes(c, p) && model_ok) {
      // Each tensor-parallel rank holds whole heads and whole key/value groups (Megatron-Core also
      // replicates groups over tp > groups; troupe does not), and an equal share of the MLP's width
      // and of the model width (the row-parallel inputs); the vocabulary is padded to a multiple of
      // tp (GptConfig::padded_vocab_size).
      if (m.num_attention_heads % tp != 0) {
        int divisor = tp;
        while (m.num_attention_heads % divisor != 0) --divisor;
        p.check(bad("--num-attention-heads",
                    fmt::format("{} is not divisible by --tensor-model-parallel-size {}", m.num_attention_heads, tp),
                    fmt::format("each tensor-parallel rank holds whole heads: use a head count that "
                                "is a multiple of {}, or --tensor-model-parallel-size {}",
                                tp, divisor)));
      } else {
        const int groups = m.num_query_groups;
        if (groups > 0 && m.num_attention_heads % groups == 0 && groups % tp != 0)
          p.check(bad("--num-query-groups",
                      fmt::format("{} is not divisible by --tensor-model-parallel-size {}", groups, tp),
                      "each tensor-parallel rank holds whole key/value groups: use a group count that is a "
                      "multiple of the tensor-parallel size, or a smaller --tensor-model-parallel-size"));
        const int ffn = m.ffn_hidden_size();
        if (ffn > 0 && ffn % tp != 0)
          p.check(bad("--ffn-hidden-size",
                      fmt::format("{} is not divisible by --tensor-model-parallel-size {}", ffn, tp),
                      "each tensor-parallel rank holds an equal share of the MLP: use a multiple of the "
                      "tensor-parallel size"));
      }
      // Megatron turns sequence parallelism off with tp 1 (finalize_train_config does too); it
      // splits each micro-batch's tokens over the tensor-parallel ranks.
      if (c.sequence_parallel && tp > 1 && int64_t{c.micro_batch_size} * m.seq_length < tp)
        p.check(bad("--sequence-parallel",
                    fmt::format("splits the --micro-batch-size {} x --seq-length {} = {} tokens of a "
                                "micro-batch over --tensor-model-parallel-size {} ranks, fewer tokens "
                                "than ranks",
                                c.micro_batch_size, m.seq_length, int64_t{c.micro_batch_size} * m.seq_length, tp),
                    "use longer sequences or a larger micro batch, or drop --sequence-parallel"));
      p.check(pipeline(c));
      long_sequences(c, p);
    }
    if (c.zero_stage < 0 || c.zero_stage > 3)
      p.check(bad("--zero-stage", fmt::format("is {}; ZeRO stages are 0 to 3", c.zero_stage),
                  "use 0 (off), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)"));
    const std::string& r = c.recompute_granularity;
    if (r != "none" && r != "full" && r != "selective")
      p.check(bad("--recompute-granularity", "is \"" + r + "\"",
                  "use full or selective, or leave the flag out for no recomputation"));
    return p.size() == before;
  }

  // Context parallelism and Ulysses (docs/PARALLEL.md, "Long sequences"). Megatron's load balancing
  // cuts every sequence into 2 cp equal chunks (megatron/core/utils.py asserts the divisibility too);
  // Ulysses gives each rank one contiguous chunk. The all-to-all (Ulysses, --cp-comm-type a2a) hands
  // each rank whole heads and key/value groups of the tensor-parallel rank's (DeepSpeed asserts the
  // heads divisible; its uneven-heads form is not troupe's).
  void long_sequences(const TrainConfig& c, Problems& p) const {
    const GptConfig& m = c.model;
    const int cp = c.context_parallel_size, u = c.ds_sequence_parallel_size, tp = c.tensor_model_parallel_size;
    const std::string& type = c.cp_comm_type;
    if (type != "p2p" && type != "all_gather" && type != "a2a")
      p.check(bad("--cp-comm-type", "is \"" + type + "\"",
                  "use p2p (a ring of key/value blocks), all_gather or a2a (an all-to-all to whole sequences of "
                  "fewer heads)"));
    if (cp > 1 && u > 1) {
      p.check(bad("--ds-sequence-parallel-size",
                  fmt::format("{} with --context-parallel-size {}: troupe splits a sequence one way at a time", u, cp),
                  "give one of them (--cp-comm-type a2a is Ulysses' all-to-all with Megatron's chunks)"));
      return;
    }
    const int n = cp * u;
    if (n <= 1) return;
    const std::string flag = u > 1 ? "--ds-sequence-parallel-size" : "--context-parallel-size";
    const int chunks = u > 1 ? n : 2 * n;  // Ulysses: one contiguous chunk per rank
    if (m.seq_length % chunks != 0) {
      std::vector<std::string> sizes;  // the sizes that divide the sequence as needed
      for (int d = 2; int64_t{chunks / n} * d <= m.seq_length && sizes.size() < 6; ++d)
        if (m.seq_length % (chunks / n * d) == 0) sizes.push_back(std::to_string(d));
      p.check(bad("--seq-length",
                  u > 1 ? fmt::format("{} is not divisible by {} {}", m.seq_length, flag, n)
                        : fmt::format("{} is not divisible by 2 x {} {} = {}", m.seq_length, flag, n, chunks),
                  fmt::format("{}: use a multiple of {}{}",
                              u > 1 ? "each Ulysses rank holds an equal, contiguous part of every sequence"
                                    : "each context-parallel rank holds 2 equal chunks of every sequence (Megatron's "
                                      "load balancing)",
                              chunks, sizes.empty() ? std::string() : ", or " + flag + " " + join_with(sizes, " or "))));
    }
    if (u > 1 || type == "a2a") {
      const int heads = m.num_attention_heads, groups = m.query_groups();
      if (tp > 0 && heads % tp == 0 && (heads / tp) % n != 0)
        p.check(bad(flag,
                    fmt::format("{} does not divide the {} attention heads of each tensor-parallel rank ({} / "
                                "--tensor-model-parallel-size {})",
                                n, heads / tp, heads, tp),
                    "the all-to-all hands each rank whole heads: use a size that divides them, or more heads"));
      else if (tp > 0 && groups > 0 && groups % tp == 0 && (groups / tp) % n != 0)
        p.check(bad(flag,
                    fmt::format("{} does not divide the {} key/value groups of each tensor-parallel rank", n,
                                groups / tp),
                    "the all-to-all hands each rank whole key/value groups: use a size that divides them, more "
                    "--num-query-groups, or --context-parallel-size with the p2p ring"));
    }
    if (c.device == "cuda")
      p.check(bad(flag, fmt::format("{} runs on the CPU only so far", n), "use --device cpu, or " + flag + " 1 on GPUs"));
    const int64_t rows = int64_t{c.micro_batch_size} * (m.seq_length / n);
    if (c.sequence_parallel && tp > 1 && rows < tp)
      p.check(bad("--sequence-parallel",
                  fmt::format("splits a context-parallel rank's {} tokens of a micro-batch over "
                              "--tensor-model-parallel-size {} ranks, fewer tokens than ranks",
                              rows, tp),
                  "use longer sequences, a larger micro batch or a smaller " + flag + ", or drop --sequence-parallel"));
  }

  // Mixture of experts over the layout (include/troupe/train_config.hpp): each MoE layer's experts
  // split over expert_model_parallel_size ranks of the data-parallel group (Megatron-Core and
  // DeepSpeed alike: it divides every layer's experts and the data-parallel size), each expert whole
  // on every tensor-parallel rank or split like the dense MLP. The flags named are the router's
  // dialect's. Model-only rules are GptConfig::architecture_problems'.
  void experts(const TrainConfig& c, Problems& p) const {
    const GptConfig& m = c.model;
    const bool ds = m.moe.router == MoeRouter::deepspeed;
    const std::string ep_flag = ds ? "--moe-expert-parallel-size" : "--expert-model-parallel-size";
    const int ep = c.expert_model_parallel_size, etp = c.expert_tensor_parallel_size;
    const int tp = c.tensor_model_parallel_size, pp = c.pipeline_model_parallel_size;
    if (ep < 1)
      p.check(bad(ep_flag, fmt::format("must be positive, got {}", ep),
                  "use 1 (every rank holds every expert) or a divisor of the experts"));
    if (etp < 0)
      p.check(bad("--expert-tensor-parallel-size", fmt::format("must be >= 0, got {}", etp),
                  "leave it out (Megatron-LM's default: the tensor-parallel size) or give 1"));
    if (!m.moe.enabled()) {
      if (ep > 1)
        p.check(bad(ep_flag, fmt::format("{} splits experts over ranks, but the model has none", ep),
                    "add --num-experts N (a multiple of it), or drop the flag (Megatron-LM asserts the same)"));
      return;
    }
    // The rules below read each MoE layer's experts: only once those are valid (else
    // architecture_problems reports them), whatever else is wrong with the model.
    const MoeConfig& moe = m.moe;
    const int layers = m.num_layers;
    bool shape_ok = tp >= 1 && layers >= 1 && layers <= (1 << 20) &&
                    (moe.layer_pattern.empty() ? moe.layer_freq >= 1
                                               : static_cast<size_t>(layers) == moe.layer_pattern.size());
    for (const int e : moe.num_experts) shape_ok = shape_ok && e >= 1;
    if (!shape_ok || (moe.num_experts.size() > 1 && static_cast<int>(moe.num_experts.size()) != moe.moe_layers(layers)))
      return;
    if (ep >= 1) {
      std::vector<std::string> uneven;  // the expert counts ep does not divide, once each
      for (int l = 0; l < m.num_layers; ++l) {
        const std::string e = std::to_string(m.moe.experts_of(l, m.num_layers));
        if (m.moe.is_moe_layer(l, m.num_layers) && m.moe.experts_of(l, m.num_layers) % ep != 0 &&
            std::find(uneven.begin(), uneven.end(), e) == uneven.end())
          uneven.push_back(e);
      }
      if (!uneven.empty())
        p.check(bad(ep_flag,
                    fmt::format("{} does not divide the {} experts of an MoE layer", ep, join_with(uneven, " or ")),
                    "each expert-parallel rank holds an equal share of a layer's experts: use a divisor of every "
                    "--num-experts value"));
      // The data-parallel size of one process, or of the ranks troupe launch starts (validate_world
      // reports a layout that does not match them).
      const int dp = c.resolved_dp(world_size_);
      const bool layout_known =
          world_size_ <= 1 || (pp > 0 && int64_t{tp} * pp * c.sequence_ranks() * dp == world_size_);
      if (layout_known && dp > 0 && dp % ep != 0)
        p.check(bad(ep_flag, fmt::format("{} does not divide the data-parallel size {}", ep, dp),
                    "the experts are split over ranks of the data-parallel group: use a divisor of the data-parallel "
                    "size, or more data-parallel ranks"));
    }
    if (etp != 0 && etp != 1 && etp != tp) {
      p.check(bad("--expert-tensor-parallel-size",
                  fmt::format("{} is neither 1 nor --tensor-model-parallel-size {}", etp, tp),
                  "each expert is whole on every tensor-parallel rank (1) or split as the dense MLP is (the "
                  "tensor-parallel size, Megatron-LM's default)"));
    } else if (etp >= 0) {
      const int split = etp == 0 ? tp : etp;
      const int width = m.expert_ffn_hidden_size();
      if (width > 0 && width % split != 0)
        p.check(bad(m.moe.ffn_hidden > 0 ? "--moe-ffn-hidden-size" : "--ffn-hidden-size",
                    fmt::format("{} (each expert's width) is not divisible by the expert tensor-parallel size {}",
                                width, split),
                    "each rank of a split expert holds an equal share of its width: use a multiple of it, or "
                    "--expert-tensor-parallel-size 1"));
    }
    const int shared = m.moe.shared_expert_ffn;
    if (shared > 0 && shared % tp != 0)
      p.check(bad("--moe-shared-expert-intermediate-size",
                  fmt::format("{} is not divisible by --tensor-model-parallel-size {}", shared, tp),
                  "the shared expert is split as the dense MLP is: use a multiple of the tensor-parallel size"));
  }

  // The three sizes, each checked; returns whether all hold.
  bool sizes(const TrainConfig& c, Problems& p) const {
    bool ok = p.check(positive("--tensor-model-parallel-size", c.tensor_model_parallel_size, "1"));
    ok = p.check(positive("--pipeline-model-parallel-size", c.pipeline_model_parallel_size, "1")) && ok;
    ok = p.check(positive("--context-parallel-size", c.context_parallel_size, "1")) && ok;
    ok = p.check(positive("--ds-sequence-parallel-size", c.ds_sequence_parallel_size, "1")) && ok;
    if (c.data_parallel_size < 0)
      ok = p.check(bad("--data-parallel-size", fmt::format("must be >= 0, got {}", c.data_parallel_size),
                       "use 0 to derive it from the ranks troupe launch starts (1 in one process)")) &&
           ok;
    return ok;
  }

  // The schedule and its chunks: one problem at most (each rule presumes the ones before it).
  Status pipeline(const TrainConfig& c) const {
    const int layers = c.model.num_layers, pp = c.pipeline_model_parallel_size;
    const int chunk = c.num_layers_per_virtual_pipeline_stage;
    const std::string& schedule = c.pipeline_schedule;
    if (schedule != "1f1b" && schedule != "gpipe" && schedule != "interleaved" &&
        schedule != "zb-h1")
      return bad("--pipeline-schedule", "is \"" + schedule + "\"",
                 "use one of 1f1b, gpipe, interleaved, zb-h1");
    if (schedule != "interleaved") {
      if (chunk != 0)
        return bad("--num-layers-per-virtual-pipeline-stage",
                   fmt::format("{} is only used by --pipeline-schedule interleaved, but the "
                               "schedule is {}",
                               chunk, schedule),
                   "drop --num-layers-per-virtual-pipeline-stage, or drop --pipeline-schedule "
                   "(the flag alone selects interleaved, as in Megatron)");
      // Megatron requires num_layers % pp == 0; troupe's stages may hold unequal numbers of
      // layers, but not none.
      if (layers < pp)
        return bad("--pipeline-model-parallel-size",
                   fmt::format("{} is more than --num-layers {}: every pipeline stage needs at "
                               "least one layer",
                               pp, layers),
                   fmt::format("use at most {} stages, or more layers", layers));
      return Status::ok();
    }

    // Interleaved: each of the pp stages holds v >= 2 model chunks of `chunk` layers.
    if (pp < 2)
      return bad(
          "--pipeline-schedule",
          fmt::format("interleaved needs --pipeline-model-parallel-size 2 or more, got {}", pp),
          "use more pipeline stages, or another --pipeline-schedule without "
          "--num-layers-per-virtual-pipeline-stage");
    std::vector<std::string> valid;  // every chunk size that works, for the fix
    for (int n = 1; int64_t{2} * pp * n <= layers; ++n)
      if (layers % (pp * n) == 0) valid.push_back(std::to_string(n));
    const std::string fix =
        valid.empty() ? fmt::format(
                            "no chunk size works for --num-layers {} over {} stages: make "
                            "--num-layers a multiple of {} and at least {}, or use "
                            "--pipeline-schedule 1f1b",
                            layers, pp, pp, 2 * pp)
                      : fmt::format(
                            "use --num-layers-per-virtual-pipeline-stage {} (every stage then "
                            "holds 2 or more chunks)",
                            join_with(valid, " or "));
    if (chunk <= 0)
      return bad("--pipeline-schedule",
                 fmt::format("interleaved needs --num-layers-per-virtual-pipeline-stage N > 0 "
                             "(layers per model chunk), got {}",
                             chunk),
                 fix);
    if (layers % (int64_t{pp} * chunk) != 0)
      return bad("--num-layers-per-virtual-pipeline-stage",
                 fmt::format("{} does not split --num-layers {} evenly over "
                             "--pipeline-model-parallel-size {} stages ({} is not a multiple of "
                             "{} x {} = {})",
                             chunk, layers, pp, layers, pp, chunk, int64_t{pp} * chunk),
                 fix);
    if (layers / (pp * chunk) < 2)
      return bad("--num-layers-per-virtual-pipeline-stage",
                 fmt::format("{} leaves 1 model chunk per pipeline stage (--num-layers {} / "
                             "(--pipeline-model-parallel-size {} x {})); interleaving needs 2 "
                             "or more",
                             chunk, layers, pp, chunk),
                 fix);
    return Status::ok();
  }

  void optimizer(const TrainConfig& c, Problems& p) const {
    if (!(c.adam_beta1 >= 0 && c.adam_beta1 < 1))
      p.check(bad("--adam-beta1", fmt::format("must be in [0, 1), got {}", c.adam_beta1), "use e.g. 0.9"));
    if (!(c.adam_beta2 >= 0 && c.adam_beta2 < 1))
      p.check(bad("--adam-beta2", fmt::format("must be in [0, 1), got {}", c.adam_beta2), "use e.g. 0.999"));
    if (!(c.adam_eps > 0) || !std::isfinite(c.adam_eps))
      p.check(bad("--adam-eps", fmt::format("must be positive, got {}", c.adam_eps), "use e.g. 1e-8"));
    if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay))
      p.check(
          bad("--weight-decay", fmt::format("must be >= 0, got {}", c.weight_decay), "use e.g. 0.01, or 0 for none"));
    if (!(c.clip_grad >= 0) || !std::isfinite(c.clip_grad))
      p.check(bad("--clip-grad", fmt::format("must be >= 0, got {}", c.clip_grad),
                  "use e.g. 1.0, or 0 to disable clipping"));
  }

  // The loss scaling's settings (include/troupe/precision.hpp; engine/loss_scaler.hpp runs them).
  // Checked whatever the type, as Megatron's argparse reads them whatever the type. Megatron's
  // DynamicGradScaler asserts min_scale <= initial_scale; DeepSpeed's DynamicLossScaler asserts
  // nothing (a min above the initial scale lifts the scale at the first halving), so that rule is
  // Megatron's recipe's only.
  void precision(const TrainConfig& c, Problems& p) const {
    const PrecisionConfig& pr = c.precision;
    if (!(pr.loss_scale >= 0) || !std::isfinite(pr.loss_scale))
      p.check(bad("--loss-scale", fmt::format("must be >= 0, got {}", pr.loss_scale),
                  "give a static scale such as 1024, or leave it out (0) for dynamic loss scaling"));
    const bool initial_ok = pr.initial_loss_scale > 0 && std::isfinite(pr.initial_loss_scale);
    if (!initial_ok)
      p.check(bad("--initial-loss-scale", fmt::format("must be positive, got {}", pr.initial_loss_scale),
                  "use e.g. 4294967296 (2^32, Megatron's default)"));
    const bool min_ok = pr.min_loss_scale > 0 && std::isfinite(pr.min_loss_scale);
    if (!min_ok)
      p.check(bad("--min-loss-scale", fmt::format("must be positive, got {}", pr.min_loss_scale), "use e.g. 1"));
    if (pr.loss_scale_window < 1)
      p.check(bad("--loss-scale-window", fmt::format("must be at least 1, got {}", pr.loss_scale_window),
                  "use e.g. 1000 (clean steps before the scale doubles)"));
    if (pr.hysteresis < 1)
      p.check(bad("--hysteresis", fmt::format("must be at least 1, got {}", pr.hysteresis),
                  "use e.g. 2 (overflows before the scale halves)"));
    if (initial_ok && min_ok && pr.dynamic_loss_scaling() && pr.recipe == PrecisionRecipe::megatron &&
        pr.min_loss_scale > pr.initial_loss_scale)
      p.check(bad("--min-loss-scale",
                  fmt::format("{} is above --initial-loss-scale {}", pr.min_loss_scale, pr.initial_loss_scale),
                  "make the minimum at most the initial scale (Megatron asserts it)"));
    PrecisionDType ignored = PrecisionDType::fp32;
    if (!pr.communication_data_type.empty() && !parse(pr.communication_data_type, ignored))
      p.check(bad("communication_data_type", "is \"" + pr.communication_data_type + "\"", "use fp16, bf16 or fp32"));
  }

  void schedule(const TrainConfig& c, Problems& p) const {
    const size_t before = p.size();
    const bool lr_ok = c.lr >= 0 && std::isfinite(c.lr);
    if (!lr_ok) p.check(bad("--lr", fmt::format("must be >= 0, got {}", c.lr), "use e.g. 6e-4"));
    if (lr_ok && (!(c.min_lr >= 0) || c.min_lr > c.lr))
      p.check(bad("--min-lr", fmt::format("must be in [0, --lr {}], got {}", c.lr, c.min_lr),
                  "use a value between 0 and the peak learning rate"));
    if (!(c.lr_warmup_init >= 0) || !std::isfinite(c.lr_warmup_init))
      p.check(bad("--lr-warmup-init", fmt::format("must be >= 0, got {}", c.lr_warmup_init), "use e.g. 0"));
    const std::string& style = c.lr_decay_style;
    if (style != "constant" && style != "linear" && style != "cosine")
      p.check(bad("--lr-decay-style", "is \"" + style + "\"", "use constant, linear or cosine"));
    if (c.lr_warmup_style != "linear" && c.lr_warmup_style != "log")
      p.check(bad("--lr-warmup-style", "is \"" + c.lr_warmup_style + "\"", "use linear or log"));
    if (c.lr_warmup_iters < 0)
      p.check(bad("--lr-warmup-iters", fmt::format("must be >= 0, got {}", c.lr_warmup_iters), "use 0 for no warm-up"));
    if (c.lr_warmup_style == "log" && c.lr_warmup_iters == 1)
      p.check(bad("--lr-warmup-iters", "is 1, too short for the log warm-up (ln 1 = 0)",
                  "use at least 2 (DeepSpeed rounds up to 2), or --lr-warmup-style linear"));
    if (c.lr_decay_iters < 0)
      p.check(bad("--lr-decay-iters", fmt::format("must be >= 0, got {}", c.lr_decay_iters),
                  "use 0 to decay over --train-iters"));
    schedule_units(c, p);
    if (p.size() != before) return;  // the lengths below need every setting above
    const TrainConfig::LrLengths l = c.lr_lengths();
    if (c.lr_decay_tokens <= 0 && style != "constant" && l.warmup_samples >= l.decay_samples) {
      if (c.train_samples > 0 || c.lr_warmup_fraction >= 0) {
        p.check(bad(
            c.lr_warmup_fraction >= 0 ? "--lr-warmup-fraction" : "--lr-warmup-samples",
            fmt::format("gives a warm-up of {} samples, not below the decay's {}", l.warmup_samples, l.decay_samples),
            "shorten the warm-up, lengthen the decay, or use --lr-decay-style constant"));
        return;
      }
      const int64_t decay = c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters;
      p.check(bad("--lr-warmup-iters",
                  fmt::format("{} is not below the {} decay iterations ({})", c.lr_warmup_iters, decay,
                              c.lr_decay_iters > 0 ? "--lr-decay-iters" : "--train-iters"),
                  "shorten the warm-up, lengthen the decay, or use --lr-decay-style constant"));
    }
  }

  // Megatron's rules for the units of a run and its schedule (megatron/training/arguments.py,
  // validate_args): an iteration-based run measures its schedule in iterations, a sample-based one
  // in samples; one warm-up length at most; Megatron-DeepSpeed's token lengths on top.
  void schedule_units(const TrainConfig& c, Problems& p) const {
    const bool by_samples = c.train_samples > 0;
    if (c.train_samples < 0 || c.lr_warmup_samples < 0 || c.lr_decay_samples < 0 || c.train_tokens < 0 ||
        c.lr_decay_tokens < 0 || c.lr_warmup_tokens < -1) {
      p.check(bad("the sample and token flags", "hold a negative count", "give counts of 0 or more"));
      return;  // the lengths below would be meaningless
    }
    if (!by_samples && (c.lr_warmup_samples > 0 || c.lr_decay_samples > 0))
      p.check(bad(c.lr_decay_samples > 0 ? "--lr-decay-samples" : "--lr-warmup-samples",
                  "is given in an iteration-based run (no --train-samples)",
                  "give --lr-decay-iters / --lr-warmup-iters, or train by --train-samples"));
    if (by_samples && (c.lr_warmup_iters > 0 || c.lr_decay_iters > 0))
      p.check(bad(c.lr_decay_iters > 0 ? "--lr-decay-iters" : "--lr-warmup-iters",
                  "is given in a sample-based run (--train-samples)",
                  "give --lr-decay-samples / --lr-warmup-samples, or train by --train-iters"));
    if (c.lr_warmup_fraction >= 0 && (c.lr_warmup_iters > 0 || c.lr_warmup_samples > 0))
      p.check(bad("--lr-warmup-fraction", "is given with another warm-up length",
                  "give one of --lr-warmup-fraction, --lr-warmup-iters and --lr-warmup-samples"));
    if (c.lr_warmup_fraction != -1 && !(c.lr_warmup_fraction >= 0 && c.lr_warmup_fraction < 1))
      p.check(
          bad("--lr-warmup-fraction", fmt::format("must be in [0, 1), got {}", c.lr_warmup_fraction), "use e.g. .01"));
    const bool tokens = c.lr_warmup_tokens >= 0 || c.lr_decay_tokens > 0;
    if (c.lr_warmup_style == "log" && (by_samples || c.lr_warmup_fraction >= 0 || tokens))
      p.check(bad("--lr-warmup-style", "is log (DeepSpeed's, counted in steps) with a sample- or token-based warm-up",
                  "use --lr-warmup-style linear, or --lr-warmup-iters"));
    if (c.lr_decay_tokens > 0 && c.lr_decay_style != "constant" && c.global_batch_size > 0) {
      const TrainConfig::LrLengths l = c.lr_lengths();
      if (c.lr_warmup_tokens < 0 && l.warmup_samples > 0 &&
          std::fmod(l.warmup_samples, static_cast<double>(c.global_batch_size)) != 0) {
        p.check(bad("--lr-decay-tokens",
                    fmt::format("with a warm-up of {} samples, not whole global batches of {}", l.warmup_samples,
                                c.global_batch_size),
                    "give --lr-warmup-tokens too (Megatron-DeepSpeed takes the tokens consumed when the warm-up "
                    "ends, which it never reaches exactly here)"));
      } else {
        const double w =
            c.lr_warmup_tokens >= 0 ? static_cast<double>(c.lr_warmup_tokens) : l.warmup_samples * c.model.seq_length;
        if (w >= static_cast<double>(c.lr_decay_tokens))
          p.check(bad("--lr-decay-tokens", fmt::format("{} is not above the warm-up's {} tokens", c.lr_decay_tokens, w),
                      "lengthen the decay or shorten the warm-up"));
      }
    }
  }

  // Megatron's rule (arguments.py): one data source, --mock-data, --data-path or the per-split
  // paths; each a blend (storage/data_blend.hpp) whose datasets exist. Every problem at once.
  // A DataSource given in code is the run's data: a config that also names some would leave one of
  // the two unused, so it is refused rather than guessed.
  void no_data_named(const TrainConfig& c, Problems& p) const {
    if (c.mock_data)
      p.check(bad("--mock-data", "is set, but a DataSource was given in code (the run's data)",
                  "drop mock_data, or pass no DataSource (null) to train on mock data"));
    for (const auto* paths : {&c.data_path, &c.train_data_path, &c.valid_data_path, &c.test_data_path})
      if (blend_given(*paths))
        p.check(bad(paths == &c.data_path         ? "--data-path"
                    : paths == &c.train_data_path ? "--train-data-path"
                    : paths == &c.valid_data_path ? "--valid-data-path"
                                                  : "--test-data-path",
                    "names datasets, but a DataSource was given in code (the run's data)",
                    "clear the config's data paths, or pass no DataSource (null) to open what the config names"));
  }

  void data_paths(const TrainConfig& c, Problems& p) const {
    const bool per_split =
        blend_given(c.train_data_path) || blend_given(c.valid_data_path) || blend_given(c.test_data_path);
    const bool data_path = blend_given(c.data_path);
    const int sources = int{c.mock_data} + int{data_path} + int{per_split};
    if (sources > 1) {
      p.check(bad(c.mock_data ? "--mock-data" : "--data-path",
                  std::string("and ") + (c.mock_data && data_path ? "--data-path" : "--train/valid/test-data-path") +
                      " are both given (Megatron: a single data source)",
                  "drop all but one: --mock-data (synthetic tokens), --data-path (datasets split by --split), or "
                  "--train-data-path with --valid-data-path / --test-data-path (a blend per split)"));
      return;
    }
    if (c.mock_data) return;
    if (sources == 0) {
      p.check(bad("--data-path", "is required",
                  "run `troupe preprocess` first and pass its output prefix (PREFIX of PREFIX.bin and PREFIX.idx), "
                  "or a blend: --data-path 0.3 a_text_document 0.7 b_text_document"));
      return;
    }
    const std::pair<const char*, const std::vector<std::string>*> lists[] = {
        {"--data-path", &c.data_path},
        {"--train-data-path", &c.train_data_path},
        {"--valid-data-path", &c.valid_data_path},
        {"--test-data-path", &c.test_data_path}};
    for (const auto& [flag, items] : lists) {
      auto blend = parse_data_blend(*items, flag);
      if (!blend) {
        p.check(blend.status());
        continue;
      }
      std::error_code ec;
      for (const std::string& prefix : blend->prefixes) {
        std::string missing;
        for (const char* ext : {".bin", ".idx"})
          if (!fs::is_regular_file(prefix + ext, ec)) missing += std::string(missing.empty() ? "" : " and ") + prefix + ext;
        if (!missing.empty())
          p.check(Status::error(std::string(flag) + " " + prefix + ": " + missing +
                                " not found -- run `troupe "
                                "preprocess` first, and pass the prefix it wrote (without .bin/.idx)"));
      }
    }
    if (per_split && !blend_given(c.train_data_path))
      p.check(
          Status::error("--valid-data-path / --test-data-path without --train-data-path -- give the training "
                        "datasets with --train-data-path, or use --data-path with --split"));
    // The data loader's own parser (Megatron's rule), so both accept exactly the same strings;
    // Megatron ignores --split with per-split paths.
    if (data_path)
      if (auto parsed = split_document_indices(1, c.split); !parsed) p.check(parsed.status());
  }

  void data(const TrainConfig& c, Problems& p) const {
    if (given_.data)
      no_data_named(c, p);
    else
      data_paths(c, p);
    std::error_code ec;
    if (c.tokenizer_type == "NullTokenizer") {
      // Its vocabulary size stands where a model file would (include/troupe/train_config.hpp).
      const std::string& n = c.tokenizer_model;
      const bool number = !n.empty() && n.size() <= 10 && n.find_first_not_of("0123456789") == std::string::npos &&
                          std::stoll(n) >= 2 && std::stoll(n) <= INT_MAX;
      if (!number)
        p.check(bad("--tokenizer-type",
                    "is NullTokenizer, whose vocabulary size is missing or not a size (\"" + n + "\")",
                    "give --vocab-size N (2 to 2147483647)"));
      return;
    }
    if (c.mock_data) return;
    if (c.tokenizer_type == "GPT2BPETokenizer") {
      const std::pair<const char*, const std::string*> files[] = {{"--vocab-file", &c.vocab_file},
                                                                  {"--merge-file", &c.merge_file}};
      for (const auto& [flag, path] : files) {
        if (path->empty())
          p.check(bad(flag, "is required by --tokenizer-type GPT2BPETokenizer",
                      "pass GPT-2's vocab.json (--vocab-file) and merges.txt (--merge-file), the ones "
                      "the data was preprocessed with"));
        else if (!fs::is_regular_file(*path, ec))
          p.check(bad(flag, *path + " not found", "check the path"));
      }
    } else if (tokenizer_uses_model(c.tokenizer_type)) {
      if (c.tokenizer_model.empty())
        p.check(bad("--tokenizer-model", "is required by --tokenizer-type " + c.tokenizer_type,
                    c.tokenizer_type == "HuggingFaceTokenizer" || c.tokenizer_type == "HFTokenizer"
                        ? "pass the folder holding tokenizer.json (or the file), the one the data was preprocessed with"
                        : "pass the SentencePiece model file the data was preprocessed with"));
      else if (!fs::exists(c.tokenizer_model, ec))
        p.check(bad("--tokenizer-model", c.tokenizer_model + " not found", "check the path"));
    } else if (c.tokenizer_type != "ByteLevelTokenizer") {
      p.check(bad("--tokenizer-type", "is \"" + c.tokenizer_type + "\"",
                  std::string("use one of ") + kTokenizerTypes + ", the one the data was preprocessed with"));
    }
  }

  // Whether `path` could be created later: it is, or its nearest existing ancestor is, a writable
  // directory. Nothing is created here.
  Status creatable_directory(const std::string& flag, const std::string& path) const {
    std::error_code ec;
    if (fs::exists(path, ec)) {
      if (!fs::is_directory(path, ec))
        return bad(flag, path + " exists and is not a directory", "choose a directory path");
      if (::access(path.c_str(), W_OK) != 0)
        return bad(flag, path + " is not writable", "choose a directory you can write to");
      return Status::ok();
    }
    fs::path ancestor = fs::absolute(path, ec).parent_path();
    while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.parent_path())
      ancestor = ancestor.parent_path();
    if (!fs::is_directory(ancestor, ec))
      return bad(flag, path + " cannot be created: " + ancestor.string() + " is not a directory",
                 "choose a path under a directory");
    if (::access(ancestor.c_str(), W_OK) != 0)
      return bad(flag, path + " cannot be created: " + ancestor.string() + " is not writable",
                 "choose a path under a directory you can write to");
    return Status::ok();
  }

  void checkpoints(const TrainConfig& c, Problems& p) const {
    if (c.save_interval < 0)
      p.check(bad("--save-interval", fmt::format("must be >= 0, got {}", c.save_interval),
                  "use 0 to save only at the end"));
    if (c.exit_interval < 0)
      p.check(bad("--exit-interval", fmt::format("must be >= 0, got {}", c.exit_interval),
                  "use 0 to train to --train-iters"));
    if (c.override_opt_param_scheduler && c.use_checkpoint_opt_param_scheduler)
      p.check(bad("--override-opt_param-scheduler", "and --use-checkpoint-opt_param-scheduler are both given",
                  "keep one: this run's schedule wins (override) or the checkpoint's (use-checkpoint)"));
    if (!(c.exit_duration_in_mins >= 0) || !std::isfinite(c.exit_duration_in_mins))
      p.check(bad("--exit-duration-in-mins",
                  fmt::format("must be a non-negative number, got {}", c.exit_duration_in_mins),
                  "use 0 to train to --train-iters"));
    if (c.save_memory_interval < 0)
      p.check(bad("--save-memory-interval", fmt::format("must be >= 0, got {}", c.save_memory_interval),
                  "use 0 for no in-memory snapshots, or e.g. 10"));
    if (c.save_memory_interval == 0 && !c.save_memory_dir.empty())
      p.check(bad("--save-memory-dir", "is only used with --save-memory-interval",
                  "add --save-memory-interval N, or drop --save-memory-dir"));
    if (c.max_saves_in_flight < 1 || c.max_saves_in_flight > 64)
      p.check(bad("--max-saves-in-flight", fmt::format("must be 1 to 64, got {}", c.max_saves_in_flight),
                  "use 1 (the default): each save holds a host copy of this process's shards until written"));
    if (!c.save.empty()) p.check(creatable_directory("--save", c.save));
    if (!c.load.empty()) {
      std::error_code ec;
      if (!fs::is_directory(c.load, ec))
        p.check(bad("--load", c.load + " is not a directory",
                    "pass the --save directory of an earlier run, or drop --load to start from scratch"));
      else if (!fs::is_regular_file(fs::path(c.load) / "latest_checkpointed_iteration.txt", ec) &&
               !is_hf_folder(c.load))
        p.check(bad("--load", c.load + " has no latest_checkpointed_iteration.txt, so no finished checkpoint",
                    "pass the --save directory of a run that saved, or drop --load to start from scratch"));
    }
  }

  // --device: cpu, or cuda (one process per GPU under troupe launch; every layout: docs/CUDA.md).
  void device(const TrainConfig& c, Problems& p) const {
    if (c.device != "cpu" && c.device != "cuda") p.check(bad("--device", "is \"" + c.device + "\"", "use cpu or cuda"));
    if (c.device == "cuda" && c.model.moe.enabled())
      p.check(bad("--device", "cuda with mixture of experts (--num-experts): the CUDA backend has no MoE kernels yet",
                  "train the MoE model with --device cpu, or a model without experts on the GPU"));
  }

  void offload_and_restarts(const TrainConfig& c, Problems& p) const {
    const std::string& device = c.offload_optimizer;
    if (device != "none" && device != "cpu" && device != "nvme") {
      p.check(bad("--offload-optimizer", "is \"" + device + "\"",
                  "use cpu (host memory pool) or nvme (files under --offload-path), or none"));
    } else if (device == "nvme") {
      std::error_code ec;
      if (c.offload_path.empty())
        p.check(bad("--offload-optimizer", "is nvme but no --offload-path is given",
                    "add --offload-path DIR, a directory on a fast local disk for the swap files"));
      else if (!fs::is_directory(c.offload_path, ec))
        p.check(bad("--offload-path", c.offload_path + " is not a directory",
                    "create it (mkdir -p) on a fast local disk, or give another directory"));
      else if (::access(c.offload_path.c_str(), W_OK | X_OK) != 0)
        p.check(bad("--offload-path", c.offload_path + " is not writable by this user",
                    "give a directory you can write to"));
    } else if (!c.offload_path.empty()) {
      p.check(bad("--offload-path", "is only used by --offload-optimizer nvme, but that is " + device,
                  "add --offload-optimizer nvme, or drop --offload-path"));
    }
    if (c.max_restarts < 0)
      p.check(bad("--max-restarts", fmt::format("must be >= 0, got {}", c.max_restarts),
                  "use 0 to stop at the first failure"));
    if (!(c.distributed_timeout_minutes > 0))
      p.check(bad("--distributed-timeout-minutes",
                  fmt::format("must be positive, got {}", c.distributed_timeout_minutes),
                  "use e.g. 10 (Megatron's default)"));
    if (!c.inspect.empty() && !parse_inspect_address(c.inspect))
      p.check(bad("--inspect", "is \"" + c.inspect + "\", not [HOST:]PORT with a port from 0 to 65535",
                  "use e.g. --inspect 0 (loopback, a free port) or --inspect 0.0.0.0:29600"));
    if (!c.dashboard.empty() && !parse_inspect_address(c.dashboard))
      p.check(bad("--dashboard", "is \"" + c.dashboard + "\", not [HOST:]PORT with a port from 0 to 65535",
                  "use e.g. --dashboard 0 (loopback, a free port) or --dashboard 0.0.0.0:8080"));
    if (c.inspect.empty() && c.dashboard.empty() && !c.inspect_file.empty())
      p.check(bad("--inspect-file", "is only used with --inspect or --dashboard",
                  "add --inspect 0, or drop --inspect-file"));
    if (!(c.inspect_stall_seconds >= 0) || !std::isfinite(c.inspect_stall_seconds))
      p.check(bad("--inspect-stall-seconds", fmt::format("must be >= 0, got {}", c.inspect_stall_seconds),
                  "use 0 for the default (the smaller of 60 s and half of --distributed-timeout-minutes)"));
    if (c.max_restarts > 0 && c.save.empty() && c.save_memory_interval == 0)
      p.check(bad("--max-restarts",
                  fmt::format("is {}, but without --save there is no checkpoint to restart from", c.max_restarts),
                  "add --save DIR and --save-interval N, or --save-memory-interval N (restarts resume from the latest "
                  "checkpoint)"));
  }

  void logging(const TrainConfig& c, Problems& p) const {
    p.check(positive("--eval-interval", c.eval_interval, "1000"));
    if (c.eval_iters < 0)
      p.check(bad("--eval-iters", fmt::format("must be >= 0, got {}", c.eval_iters), "use 0 to skip evaluation"));
    p.check(positive("--log-interval", c.log_interval, "100"));
    if (c.num_threads < 0)
      p.check(bad("--num-threads", fmt::format("must be >= 0, got {}", c.num_threads), "use 0 for all cores"));
    p.check(output_file("--metrics-file", c.metrics_file, "metrics.jsonl"));
    p.check(output_file("--timeline", c.timeline, "timeline.json"));
    const TensorBoardConfig& t = c.tensorboard;
    p.check(positive("--tensorboard-log-interval", t.log_interval, "1"));
    p.check(positive("--tensorboard-queue-size", t.queue_size, "1000"));
    if (!t.dir.empty()) p.check(creatable_directory("--tensorboard-dir", t.dir));
  }

  // A file written later: not a directory, and its directory exists. Nothing is created here.
  Status output_file(const std::string& flag, const std::string& path,
                     const std::string& example) const {
    if (path.empty()) return Status::ok();
    std::error_code ec;
    if (fs::is_directory(path, ec))
      return bad(flag, path + " is a directory", "name a file, e.g. " + example);
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    if (!fs::is_directory(dir, ec))
      return bad(flag, "directory " + dir.string() + " does not exist",
                 "create it first or choose a file in an existing directory");
    return Status::ok();
  }

  const Origins* origins_;
  GivenInCode given_;
  int world_size_ = 1;  // the ranks troupe launch starts (1: one process)
};

}  // namespace

Status validate_train_config(const TrainConfig& cfg, const FlagOrigins* origins, const GivenInCode& given,
                             int world_size) {
  return Validator(origins, given, world_size).run(cfg);
}

Status validate_world(const TrainConfig& cfg, int world_size) {
  return Validator(nullptr).world(cfg, world_size);
}

std::optional<InspectAddress> parse_inspect_address(const std::string& text) {
  InspectAddress a;
  std::string port = text;
  a.host = "127.0.0.1";
  if (!text.empty() && text.front() == '[') {  // [v6]:port
    const size_t close = text.find("]:");
    if (close == std::string::npos || close == 1) return std::nullopt;
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (colon == 0 || text.find(':') != colon) return std::nullopt;
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  a.port = std::stoi(port);
  if (a.port > 65535) return std::nullopt;
  for (char ch : a.host)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ':' || ch == '-')) return std::nullopt;
  return a;
}

}  // namespace troupe
