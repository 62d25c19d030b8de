#include "apps/cli/train_options.hpp"

#include <fmt/format.h>
#include <unistd.h>  // access(W_OK): whether --save could be created later

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "config/deepspeed_config.hpp"
#include "config/model_presets.hpp"
#include "config/imported_config.hpp"
#include "apps/cli/moe_flags.hpp"
#include "config/validate.hpp"
#include "storage/gpt_dataset.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

// The family flags' values and combinations (Megatron-LM megatron/training/arguments.py and
// Megatron-DeepSpeed megatron/arguments.py), then --model-preset for what was not given. Each
// problem goes to `problems` (reported with validation's); notes are start-up lines.
void apply_family_flags(const CLI::App& cmd, const FlagGivenFn& given, GptConfig& m,
                        std::vector<std::string>& problems, std::vector<std::string>* notes) {
  auto value = [&cmd](const char* flag) { return cmd.get_option(flag)->as<std::string>(); };
  auto integer = [&](const char* flag, int* out) {
    const std::string v = value(flag);
    try {
      size_t used = 0;
      const long long n = std::stoll(v, &used);
      if (used == v.size() && n >= INT_MIN && n <= INT_MAX) return *out = static_cast<int>(n), true;
    } catch (const std::exception&) {
    }
    problems.push_back(std::string(flag) + " " + v + " is not an integer -- pass a whole number, e.g. 8");
    return false;
  };
  if (given("--normalization")) {
    // Megatron-LM spells LayerNorm / RMSNorm, Megatron-DeepSpeed layernorm / rmsnorm.
    const std::string v = value("--normalization");
    if (v == "layernorm") m.normalization = Normalization::layernorm;
    else if (v == "rmsnorm") m.normalization = Normalization::rmsnorm;
    else if (!parse(v, m.normalization))
      problems.push_back("--normalization " + v + " is not a normalization -- use LayerNorm or RMSNorm");
  }
  if (given("--swiglu")) m.activation = MlpActivation::swiglu;
  const bool type_given = given("--position-embedding-type");
  if (type_given && !parse(value("--position-embedding-type"), m.position_embedding))
    problems.push_back("--position-embedding-type " + value("--position-embedding-type") +
                       " is not a position embedding -- use learned_absolute, rope, alibi or none");
  if (given("--use-rotary-position-embeddings")) {
    if (type_given && m.position_embedding != PositionEmbedding::rope)
      problems.push_back(std::string("--use-rotary-position-embeddings and --position-embedding-type ") +
                         to_string(m.position_embedding) + " contradict each other -- keep one of them");
    m.position_embedding = PositionEmbedding::rope;
  }
  // Grouped-query attention: Megatron-LM's --num-query-groups counts only with
  // --group-query-attention (and is 1 then by default); Megatron-DeepSpeed's --num-key-value-heads
  // always. A preset with grouped-query attention (LLaMA-2 70B, LLaMA-3) stands for the switch.
  const ModelPreset* preset = given("--model-preset") ? find_model_preset(value("--model-preset")) : nullptr;
  const bool gqa = given("--group-query-attention") || (preset != nullptr && preset->model.num_query_groups > 0);
  int groups = 0, kv_heads = 0;
  const bool groups_given = given("--num-query-groups") && integer("--num-query-groups", &groups);
  const bool kv_given = given("--num-key-value-heads") && integer("--num-key-value-heads", &kv_heads);
  if (kv_given) {
    if (groups_given && gqa && groups != kv_heads)
      problems.push_back("--num-query-groups " + std::to_string(groups) + " and --num-key-value-heads " +
                         std::to_string(kv_heads) + " disagree -- give one of them");
    m.num_query_groups = kv_heads;
  } else if (gqa && (groups_given || given("--group-query-attention"))) {
    m.num_query_groups = groups_given ? groups : 1;
  } else if (groups_given && notes != nullptr) {
    notes->push_back("--num-query-groups " + std::to_string(groups) + ": no effect without --group-query-attention, "
                     "as in Megatron (multi-head attention) -- add --group-query-attention to group the key/value heads");
  }
  if (given("--disable-bias-linear") && given("--add-bias-linear"))
    problems.push_back("--disable-bias-linear and --add-bias-linear contradict each other -- keep one of them");
  else if (given("--disable-bias-linear"))
    m.add_bias_linear = false;
  else if (given("--add-bias-linear"))
    m.add_bias_linear = true;

  if (given("--model-preset")) {
    const std::string name = value("--model-preset");
    if (preset == nullptr) {
      problems.push_back("--model-preset " + name + " is not a preset -- use one of " + model_preset_names());
    } else {
      apply_model_preset(*preset, &m, given);
      if (notes != nullptr)
        notes->push_back("--model-preset " + name + ": " + preset->source + "'s architecture; the vocabulary is "
                         "--tokenizer-type's (" + name + "'s own tokenizer has " +
                         std::to_string(preset->model.vocab_size) + " tokens)");
      // A preset's rotary settings go with its rotary positions: overriding the positions drops them.
      if (m.position_embedding != PositionEmbedding::rope) {
        const GptConfig d;
        if (!given("--rotary-base")) m.rotary_base = d.rotary_base;
        if (!given("--rotary-percent")) m.rotary_percent = d.rotary_percent;
        if (!given("--rotary-interleaved")) m.rotary_interleaved = d.rotary_interleaved;
      }
    }
  }
  if (given("--no-position-embedding")) {
    // Megatron-DeepSpeed: no learned table (beside rotary: the LLaMA scripts); Megatron-LM refuses it
    // without rope. Alone it means no positions at all.
    if (type_given && m.position_embedding == PositionEmbedding::learned_absolute)
      problems.push_back("--no-position-embedding and --position-embedding-type learned_absolute contradict each other "
                         "-- keep one of them");
    else if (m.position_embedding == PositionEmbedding::learned_absolute && !type_given)
      m.position_embedding = PositionEmbedding::none;
  }
}

// --tokenizer-type NullTokenizer takes its vocabulary size from --vocab-size (Megatron asserts it is
// given); the other tokenizers from their files, Megatron reading --vocab-size only for NullTokenizer
// and TikTokenizer.
void apply_tokenizer_flags(const CLI::App& cmd, const FlagGivenFn& given, TrainConfig* cfg,
                           std::vector<std::string>& problems, std::vector<std::string>* notes) {
  const std::string size = given("--vocab-size") ? cmd.get_option("--vocab-size")->as<std::string>() : "";
  if (cfg->tokenizer_type != "NullTokenizer") {
    if (!size.empty() && notes != nullptr)
      notes->push_back("--vocab-size " + size +
                       ": no effect -- Megatron reads it for NullTokenizer only (and "
                       "TikTokenizer); --tokenizer-type " +
                       cfg->tokenizer_type + " sets the vocabulary");
    return;
  }
  if (size.empty()) {
    problems.push_back(
        "--tokenizer-type NullTokenizer needs --vocab-size N, its vocabulary size (Megatron asserts "
        "it too)");
    return;
  }
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(size, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != size.size() || n < 2 || n > INT_MAX) {
    problems.push_back("--vocab-size " + size +
                       " is not a vocabulary size -- give a whole number of tokens from 2 "
                       "to 2147483647, e.g. 50257");
    return;
  }
  if (given("--tokenizer-model") && notes != nullptr)
    notes->push_back("--tokenizer-model: no effect with NullTokenizer, which has no files (as in Megatron)");
  cfg->tokenizer_model = std::to_string(n);
}

}  // namespace

void apply_precision_flags(const FlagGivenFn& given, TrainConfig* cfg, std::vector<std::string>* problems,
                           std::vector<std::string>* notes) {
  PrecisionConfig& p = cfg->precision;
  const bool fp16 = given("--fp16"), bf16 = given("--bf16");
  if (fp16 && bf16) {
    problems->push_back("--fp16 and --bf16 contradict each other -- keep one of them (Megatron asserts the same)");
  } else if (p.recipe != PrecisionRecipe::deepspeed) {
    // Without an enabled DeepSpeed block the flags decide, with Megatron's rules.
    if (fp16) p.dtype = PrecisionDType::fp16;
    if (bf16) p.dtype = PrecisionDType::bf16;
  }
  // Megatron's arguments.py / TransformerConfig: query-key layer scaling implies the fp32 softmax.
  if (given("--apply-query-key-layer-scaling")) p.attention_softmax_in_fp32 = true;
  if (notes == nullptr) return;
  // "--hysteresis 3" for each loss-scale flag given among `flags`, joined by ", ".
  auto given_with_values = [&](std::initializer_list<const char*> flags) {
    std::string out;
    for (const char* f : flags) {
      if (!given(f)) continue;
      const std::string f_s = f;
      const std::string v = f_s == "--loss-scale"           ? fmt::format("{}", p.loss_scale)
                            : f_s == "--initial-loss-scale" ? fmt::format("{}", p.initial_loss_scale)
                            : f_s == "--min-loss-scale"     ? fmt::format("{}", p.min_loss_scale)
                            : f_s == "--loss-scale-window"  ? fmt::format("{}", p.loss_scale_window)
                                                            : fmt::format("{}", p.hysteresis);
      out += (out.empty() ? "" : ", ") + f_s + " " + v;
    }
    return out;
  };
  const std::string dynamic =
      given_with_values({"--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis"});
  const std::string all = given_with_values(
      {"--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis"});
  const bool megatron = p.recipe == PrecisionRecipe::megatron;
  if (p.dtype == PrecisionDType::fp32) {
    if (!all.empty())
      notes->push_back(all + ": no effect -- without --fp16 or --bf16 troupe trains in float32, which scales "
                             "nothing (Megatron's FP32Optimizer has no loss scaler)");
    if (given("--accumulate-allreduce-grads-in-fp32"))
      notes->push_back("--accumulate-allreduce-grads-in-fp32: no effect -- float32 gradients are accumulated and "
                       "all-reduced in float32");
  } else if (p.dtype == PrecisionDType::bf16) {
    if (!dynamic.empty())
      notes->push_back(dynamic + " with bf16: no effect -- bf16 uses no dynamic loss scaling (Megatron "
                       "builds its DynamicGradScaler only for --fp16)");
    if (given("--loss-scale") && megatron)
      notes->push_back(fmt::format("--loss-scale {} with --bf16: a constant loss scale, as Megatron's "
                                   "ConstantGradScaler (an overflow skips the step)",
                                   p.loss_scale));
    else if (given("--loss-scale"))
      notes->push_back("--loss-scale with the DeepSpeed file's bf16: no effect -- DeepSpeed's bf16 scales nothing");
    if (given("--accumulate-allreduce-grads-in-fp32"))
      notes->push_back("--accumulate-allreduce-grads-in-fp32 with bf16: no effect -- bf16 gradients are always "
                       "accumulated and all-reduced in fp32 (Megatron forces it)");
  }
  if (given("--apply-query-key-layer-scaling"))
    notes->push_back("--apply-query-key-layer-scaling: read as --attention-softmax-in-fp32 -- the scaling divides "
                     "the scores by the layer number and multiplies it back in the fp32 softmax, the same values "
                     "up to rounding, which troupe's fp32 softmax gives");
}

void apply_model_family_flags(const CLI::App& cmd, GptConfig* m, std::vector<std::string>* problems,
                              std::vector<std::string>* notes) {
  // A command with fewer flags than `troupe train` (troupe bench gpt): a flag it lacks was not given.
  const FlagGivenFn given = [&cmd](const char* flag) {
    const CLI::Option* o = cmd.get_option_no_throw(flag);
    return o != nullptr && o->count() > 0;
  };
  apply_family_flags(cmd, given, *m, *problems, notes);
}

void add_model_family_options(CLI::App* cmd, GptConfig* model) {
  GptConfig& m = *model;
  auto opt = [cmd](const char* group, const char* name, auto& var, const char* help) {
    return cmd->add_option(name, var, help)->capture_default_str()->group(group);
  };
  // The architecture family (docs/MODELS.md): Megatron-LM's flags, and Megatron-DeepSpeed's
  // spellings beside them. The enum-valued and the combining flags are read after parsing
  // (apply_model_family_flags), so that a bad value is one problem among all.
  const char* fam = "Model family";
  cmd->add_option("--model-preset")
      ->description("A published architecture: " + model_preset_names() +
                                        " (sizes, heads, groups, MLP, positions, norm epsilon, rotary base, head "
                                        "tying); flags given beside it win")
      ->type_name("NAME")
      ->group(fam);
  cmd->add_option("--normalization")
      ->description("LayerNorm or RMSNorm (Megatron-DeepSpeed: layernorm, rmsnorm)")
      ->type_name("TEXT")
      ->default_str(to_string(m.normalization))
      ->group(fam);
  cmd->add_flag("--swiglu")
      ->description("SwiGLU MLP: fc1 is [gate | up], silu(gate) * up (default: GELU)")->group(fam);
  cmd->add_option("--position-embedding-type")
      ->description("learned_absolute, rope, alibi or none")
      ->type_name("TEXT")
      ->default_str(to_string(m.position_embedding))
      ->group(fam);
  cmd->add_flag("--use-rotary-position-embeddings")
      ->description("Same as --position-embedding-type rope (Megatron's older flag)")
      ->group(fam);
  cmd->add_flag("--no-position-embedding")
      ->description("No learned position table: --position-embedding-type none, unless rope or alibi is chosen "
                "(Megatron-DeepSpeed's switch beside --use-rotary-position-embeddings)")
      ->group(fam);
  opt(fam, "--rotary-percent", m.rotary_percent, "Share of each head's dimensions rotary rotates, in (0, 1]");
  opt(fam, "--rotary-base,--rotary-position-embeddings-theta", m.rotary_base,
      "Rotary base (Hugging Face's rope_theta; Megatron-DeepSpeed's --rotary-position-embeddings-theta)");
  cmd->add_flag("--rotary-interleaved", m.rotary_interleaved,
                "Rotate the pairs (2i, 2i+1) (Meta's original layout) instead of (i, i + d/2)")
      ->group(fam);
  cmd->add_flag("--group-query-attention")
      ->description("Grouped-query attention with --num-query-groups groups (Megatron)")
      ->group(fam);
  cmd->add_option("--num-query-groups")
      ->description("Key/value head groups with --group-query-attention (Megatron's default 1)")
      ->type_name("INT")
      ->group(fam);
  cmd->add_option("--num-key-value-heads")
      ->description("Key/value heads (Megatron-DeepSpeed's grouped-query attention; default: --num-attention-heads)")
      ->type_name("INT")
      ->group(fam);
  cmd->add_option("--kv-channels", m.kv_channels, "Head dimension (default: --hidden-size / --num-attention-heads)")
      ->group(fam);
  cmd->add_option("--ffn-hidden-size", m.ffn_hidden,
                  "MLP width (default: 4 x --hidden-size; with --swiglu Megatron's int(8h/3 / 64) x 64)")
      ->group(fam);
  cmd->add_flag("--disable-bias-linear")
      ->description("No biases in the linear layers (LLaMA)")->group(fam);
  cmd->add_flag("--add-bias-linear")
      ->description("Biases in the linear layers (the default)")->group(fam);
  cmd->add_flag("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights,
                "An own output head lm_head.weight instead of the token embedding's transpose")
      ->group(fam);
  cmd->add_flag("--embed-layernorm", m.embed_layernorm, "A LayerNorm on the embedding output (BLOOM)")->group(fam);
  opt(fam, "--norm-epsilon,--layernorm-epsilon", m.layernorm_epsilon,
      "Epsilon of the LayerNorms / RMSNorms (Megatron-DeepSpeed: --layernorm-epsilon)");
}

void add_train_options(CLI::App* cmd, TrainConfig* cfg) {
  GptConfig& m = cfg->model;
  // As with Megatron's argparse, a flag given twice takes its last value (scripts append
  // overrides).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Shows the bound value as the default; the two derived defaults say so in their help instead.
  auto opt = [cmd](const char* group, const char* name, auto& var, const char* help) {
    return cmd->add_option(name, var, help)->capture_default_str()->group(group);
  };
  const char* model = "Model";
  opt(model, "--num-layers", m.num_layers, "Transformer layers");
  opt(model, "--hidden-size", m.hidden_size, "Hidden size (width of the residual stream)");
  opt(model, "--num-attention-heads", m.num_attention_heads,
      "Attention heads; must divide --hidden-size");
  opt(model, "--seq-length", m.seq_length, "Tokens per training sequence");
  cmd->add_option("--max-position-embeddings", m.max_position_embeddings,
                  "Learned position embeddings (default: --seq-length)")
      ->group(model);
  opt(model, "--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by,
      "Pad the vocabulary to a multiple of this");
  opt(model, "--init-method-std", m.init_method_std,
      "Standard deviation of the normal weight init");
  opt(model, "--hidden-dropout", m.hidden_dropout,
      "Dropout probability on the embeddings and on each residual branch, training only");
  opt(model, "--attention-dropout", m.attention_dropout,
      "Dropout probability on the attention probabilities, training only");

  add_model_family_options(cmd, &m);
  add_moe_options(cmd);
  cmd->add_flag("--apply-layernorm-1p")
      ->description(
          "Megatron's LayerNorm 1p (weights stored as gamma - 1): the same function and, with norm "
          "weights free of weight decay as in Megatron and troupe, the same training in float32; refused "
          "with --fp16 / --bf16, where the 16-bit copy of gamma - 1 rounds differently")
      ->group(model);

  const char* batch = "Batch";
  opt(batch, "--micro-batch-size", cfg->micro_batch_size, "Sequences per forward/backward pass");
  cmd->add_option("--global-batch-size", cfg->global_batch_size,
                  "Sequences per optimizer step, a multiple of --micro-batch-size (default: "
                  "--micro-batch-size)")
      ->group(batch);

  const char* par = "Parallelism";
  opt(par, "--device", cfg->device,
      "Where the ranks compute: cpu (default) or cuda (each rank on a GPU: one process per GPU under troupe "
      "launch, rank LOCAL_RANK's on GPU LOCAL_RANK, the groups NCCL's; docs/CUDA.md)");
  opt(par, "--tensor-model-parallel-size", cfg->tensor_model_parallel_size,
      "Tensor-parallel ranks splitting every layer; must divide --num-attention-heads");
  opt(par, "--pipeline-model-parallel-size", cfg->pipeline_model_parallel_size,
      "Pipeline stages splitting the layers");
  opt(par, "--data-parallel-size", cfg->data_parallel_size,
      "Data-parallel replicas (troupe's own flag: Megatron derives it); 0: ranks / (tensor x "
      "pipeline) under troupe launch, 1 in one process");
  opt(par, "--zero-stage", cfg->zero_stage,
      "ZeRO over the data-parallel ranks: 0 off, 1 optimizer states, 2 + gradients, 3 + "
      "parameters (DeepSpeed's zero_optimization.stage)");
  opt(par, "--pipeline-schedule", cfg->pipeline_schedule, "1f1b, gpipe, interleaved or zb-h1");
  cmd->add_option("--num-layers-per-virtual-pipeline-stage",
                  cfg->num_layers_per_virtual_pipeline_stage,
                  "Layers per model chunk of the interleaved schedule; giving it selects "
                  "--pipeline-schedule interleaved, as in Megatron")
      ->group(par);
  opt(par, "--recompute-granularity", cfg->recompute_granularity,
      "Activation recomputation: full or selective (none: keep all activations)");
  opt(par, "--context-parallel-size", cfg->context_parallel_size,
      "Context-parallel ranks splitting every sequence (Megatron's load-balanced chunks; attention by a ring of "
      "key/value blocks); 2 x the size must divide --seq-length");
  cmd->add_option_function<std::vector<std::string>>(
         "--cp-comm-type",
         [cfg](const std::vector<std::string>& types) {
           // Megatron takes one type, or one per layer; troupe runs one type for every layer.
           for (const std::string& t : types)
             if (t != types.front())
               throw CLI::ValidationError("--cp-comm-type",
                                          fmt::format("gives {} and {} for different layers; troupe exchanges keys "
                                                      "and values one way in every layer -- give one type",
                                                      types.front(), t));
           if (!types.empty()) cfg->cp_comm_type = types.front();
         },
         "How context-parallel ranks exchange keys and values: p2p (a ring, the transfer overlapping the "
         "attention; default), all_gather, or a2a (an all-to-all to whole sequences of fewer heads)")
      ->group(par);
  opt(par, "--ds-sequence-parallel-size", cfg->ds_sequence_parallel_size,
      "DeepSpeed-Ulysses ranks splitting every sequence in contiguous parts; attention by whole sequences of "
      "1/N of the heads between two all-to-alls (N must divide each tensor-parallel rank's heads)");
  cmd->add_flag("--sequence-parallel", cfg->sequence_parallel,
                "Split layer-norm and dropout activations along the sequence over the "
                "tensor-parallel ranks (ignored with --tensor-model-parallel-size 1, as in "
                "Megatron)")
      ->group(par);

  const char* optim = "Optimizer and learning-rate schedule";
  opt(optim, "--lr", cfg->lr, "Peak learning rate (AdamW)");
  opt(optim, "--min-lr", cfg->min_lr, "Learning rate at the end of the decay");
  opt(optim, "--lr-decay-style", cfg->lr_decay_style, "constant, linear or cosine");
  opt(optim, "--lr-warmup-iters", cfg->lr_warmup_iters, "Warm-up iterations");
  opt(optim, "--lr-warmup-init", cfg->lr_warmup_init, "Learning rate at the start of the warm-up");
  opt(optim, "--lr-warmup-style", cfg->lr_warmup_style,
      "linear (Megatron) or log (DeepSpeed WarmupLR's default)");
  opt(optim, "--lr-decay-iters", cfg->lr_decay_iters,
      "Iterations to decay over (0: --train-iters)");
  cmd->add_option("--train-iters", cfg->train_iters,
                  "Optimizer steps to train for (or --train-samples, or --train-tokens)")
      ->group(optim);
  // Megatron's sample-based runs and Megatron-DeepSpeed's token-based ones (engine/lr_schedule.hpp).
  cmd->add_option("--train-samples", cfg->train_samples,
                  "Train for this many samples (--train-iters = samples / --global-batch-size); the schedule "
                  "then counts samples")
      ->group(optim);
  cmd->add_option("--lr-warmup-samples", cfg->lr_warmup_samples, "Warm-up samples (with --train-samples)")
      ->group(optim);
  cmd->add_option("--lr-decay-samples", cfg->lr_decay_samples,
                  "Samples to decay over (with --train-samples; default: --train-samples)")
      ->group(optim);
  cmd->add_option_function<std::vector<int64_t>>(
         "--rampup-batch-size",
         [cfg](const std::vector<int64_t>& all) {
           // Every occurrence's values (CLI11 hands over fewer than expected() for some spellings, e.g.
           // `--rampup-batch-size=2`): groups of three, the last occurrence winning as in Megatron.
           if (all.empty() || all.size() % 3 != 0)
             throw CLI::ValidationError("--rampup-batch-size",
                                        fmt::format("takes exactly 3 values (START INCREMENT SAMPLES), got {} -- "
                                                    "give e.g. --rampup-batch-size 16 16 5859375",
                                                    all.size()));
           const int64_t* v = all.data() + all.size() - 3;
           cfg->rampup_start_batch = v[0];
           cfg->rampup_batch_increment = v[1];
           cfg->rampup_samples = v[2];
         },
         "START INCREMENT SAMPLES: the global batch grows from START by INCREMENT over SAMPLES samples "
         "(Megatron's; with --train-samples)")
      ->expected(3)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(optim);
  cmd->add_option("--lr-warmup-fraction", cfg->lr_warmup_fraction,
                  "Warm up over this share of the decay length (instead of --lr-warmup-iters/-samples)")
      ->group(optim);
  cmd->add_option("--train-tokens", cfg->train_tokens,
                  "Stop once this many tokens were consumed (Megatron-DeepSpeed)")
      ->group(optim);
  cmd->add_option("--lr-warmup-tokens", cfg->lr_warmup_tokens, "Warm up over this many tokens (Megatron-DeepSpeed)")
      ->group(optim);
  cmd->add_option("--lr-decay-tokens", cfg->lr_decay_tokens, "Decay over this many tokens (Megatron-DeepSpeed)")
      ->group(optim);
  opt(optim, "--weight-decay", cfg->weight_decay, "Decoupled (AdamW) weight decay");
  opt(optim, "--adam-beta1", cfg->adam_beta1, "AdamW first-moment decay");
  opt(optim, "--adam-beta2", cfg->adam_beta2, "AdamW second-moment decay");
  opt(optim, "--adam-eps", cfg->adam_eps, "AdamW denominator epsilon");
  opt(optim, "--clip-grad", cfg->clip_grad,
      "Clip the global gradient norm to this (0: no clipping)");
  opt(optim, "--seed", cfg->seed, "Random seed of the initialisation and the data order");

  // Mixed precision (include/troupe/precision.hpp): Megatron's flags, read after parsing
  // (apply_precision_flags), so that a contradiction is one problem among all.
  const char* prec = "Mixed precision";
  PrecisionConfig& pr = cfg->precision;
  cmd->add_flag("--fp16")->description("Train in fp16 with dynamic loss scaling (fp32 master weights)")->group(prec);
  cmd->add_flag("--bf16")->description("Train in bf16 (fp32 master weights and gradients)")->group(prec);
  opt(prec, "--loss-scale", pr.loss_scale,
      "Static loss scale (> 0; also with --bf16, as Megatron); 0: dynamic loss scaling with --fp16");
  opt(prec, "--initial-loss-scale", pr.initial_loss_scale, "Initial dynamic loss scale (--fp16)");
  opt(prec, "--min-loss-scale", pr.min_loss_scale, "Minimum dynamic loss scale (--fp16)");
  opt(prec, "--loss-scale-window", pr.loss_scale_window,
      "Overflow-free steps before the dynamic loss scale doubles (--fp16)");
  opt(prec, "--hysteresis", pr.hysteresis, "Overflows before the dynamic loss scale halves (--fp16)");
  cmd->add_flag("--accumulate-allreduce-grads-in-fp32", pr.accumulate_allreduce_grads_in_fp32,
                "Accumulate and all-reduce gradients in fp32 with --fp16 (--bf16 always does)")
      ->group(prec);
  cmd->add_flag("--attention-softmax-in-fp32", pr.attention_softmax_in_fp32,
                "Run the attention's masking and softmax in fp32 with --fp16 / --bf16")
      ->group(prec);
  cmd->add_flag("--apply-query-key-layer-scaling")
      ->description("Megatron's query-key layer scaling: troupe computes the same scores; implies "
                    "--attention-softmax-in-fp32, as in Megatron")
      ->group(prec);

  const char* data = "Data";
  // Megatron's nargs='*' lists (docs/DATA.md, "Blends"): each occurrence replaces the last.
  const auto blend_option = [&](const char* name, std::vector<std::string>* target, const char* help) {
    cmd->add_option_function<std::vector<std::string>>(
           name, [target](const std::vector<std::string>& items) { *target = items; }, help)
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->trigger_on_parse()
        ->group(data);
  };
  blend_option("--data-path", &cfg->data_path,
               "PREFIX of the PREFIX.bin/PREFIX.idx written by troupe preprocess, or a blend: several prefixes "
               "(weighed by size) or WEIGHT PREFIX pairs (e.g. 0.3 a_text_document 0.7 b_text_document), also as "
               "one quoted string; each dataset split by --split");
  blend_option("--train-data-path", &cfg->train_data_path,
               "Training datasets (a prefix or a blend, as --data-path), instead of --data-path; --split is unused");
  blend_option("--valid-data-path", &cfg->valid_data_path, "Validation datasets (with --train-data-path)");
  blend_option("--test-data-path", &cfg->test_data_path, "Test datasets (with --train-data-path)");
  opt(data, "--split", cfg->split, "Train,validation,test weights over the documents");
  opt(data, "--tokenizer-type", cfg->tokenizer_type,
      "GPT2BPETokenizer, ByteLevelTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, HuggingFaceTokenizer, "
      "HFTokenizer (Megatron-DeepSpeed's) or NullTokenizer (no files: --vocab-size tokens, for --mock-data)");
  cmd->add_option("--vocab-size",
                  "NullTokenizer's vocabulary size (Megatron's; the other tokenizers take theirs from their files, "
                  "as Megatron does)")
      ->group(data);
  opt(data, "--vocab-file", cfg->vocab_file, "GPT-2 vocab.json (GPT2BPETokenizer)");
  opt(data, "--merge-file", cfg->merge_file, "GPT-2 merges.txt (GPT2BPETokenizer)");
  opt(data, "--tokenizer-model", cfg->tokenizer_model,
      "SentencePiece model (GPTSentencePieceTokenizer, Llama2Tokenizer), or tokenizer.json or its folder "
      "(HuggingFaceTokenizer)");
  cmd->add_flag("--no-shuffle", cfg->no_shuffle, "Read the samples in order instead of shuffled")
      ->group(data);
  cmd->add_flag("--mock-data", cfg->mock_data,
                "Train on synthetic uniform random tokens (no --data-path; for benchmarks)")
      ->group(data);

  const char* ckpt = "Checkpoints";
  opt(ckpt, "--save", cfg->save, "Directory to save checkpoints to (created when first saving)");
  opt(ckpt, "--save-interval", cfg->save_interval, "Save every N iterations (0: only at the end)");
  opt(ckpt, "--exit-interval", cfg->exit_interval,
      "Stop (saving a checkpoint when --save is set) once the iteration is a multiple of N");
  opt(ckpt, "--load", cfg->load,
      "Directory to resume from (holds latest_checkpointed_iteration.txt), or a Hugging Face GPT-2 folder "
      "(config.json + model.safetensors: fine-tuned from, as with --finetune)");
  cmd->add_flag("--finetune", cfg->finetune,
                "On --load, take the parameters only: a new run from iteration 0 with fresh optimizer state, "
                "schedule and data position (Megatron's --finetune)")
      ->group(ckpt);
  cmd->add_flag("--no-load-optim", cfg->no_load_optim,
                "On --load, take the parameters, iteration and data position but start the Adam moments afresh")
      ->group(ckpt);
  cmd->add_flag("--override-opt_param-scheduler,--override-opt-param-scheduler", cfg->override_opt_param_scheduler,
                "On --load, use this run's learning-rate schedule flags where they differ from the checkpoint's")
      ->group(ckpt);
  cmd->add_flag("--use-checkpoint-opt_param-scheduler,--use-checkpoint-opt-param-scheduler",
                cfg->use_checkpoint_opt_param_scheduler,
                "On --load, keep the checkpoint's learning-rate schedule and ignore this run's schedule flags")
      ->group(ckpt);
  cmd->add_flag("--exit-on-missing-checkpoint")
      ->description(
          "With --load of a folder that holds no checkpoint yet: stop (exit 2) instead of starting from scratch "
          "(Megatron's switch)")
      ->group(ckpt);
  opt(ckpt, "--exit-duration-in-mins", cfg->exit_duration_in_mins,
      "Stop (saving a checkpoint when --save is set) once training has run this many minutes (0: never)");
  cmd->add_flag("--exit-signal-handler")
      ->description(
          "Accepted for Megatron scripts: SIGTERM and SIGINT always finish the iteration, save with --save and exit "
          "(143 and 130)")
      ->group(ckpt);
  opt(ckpt, "--save-memory-interval", cfg->save_memory_interval,
      "Snapshot the model and optimizer state into host memory (a tmpfs) every N iterations, in the background; a "
      "restart (--max-restarts, or troupe launch's) resumes from the newest snapshot, in memory or in --save (0: none; "
      "over several hosts each shard is also copied to a process of the next host)");
  opt(ckpt, "--save-memory-dir", cfg->save_memory_dir,
      "Where the in-memory snapshots go: a directory on a tmpfs (default /dev/shm; the folder troupe-memory-<pid> "
      "in it, or troupe-memory-<run id> under troupe launch, removed when the run ends)");
  opt(ckpt, "--max-saves-in-flight", cfg->max_saves_in_flight,
      "Background checkpoint saves written at once; a further save waits for one to finish (bounds memory and how "
      "far the latest durable checkpoint trails)");

  const char* resilience = "Offload and supervision";
  opt(resilience, "--offload-optimizer", cfg->offload_optimizer,
      "Where the Adam moments live: none, cpu (ZeRO-Offload: the process's host memory pool and "
      "the optimizer's own thread) or nvme (ZeRO-Infinity: files under --offload-path, read ahead "
      "and written back each step); DeepSpeed's zero_optimization.offload_optimizer.device");
  opt(resilience, "--offload-path", cfg->offload_path,
      "Directory of the optimizer swap files with --offload-optimizer nvme (DeepSpeed's nvme_path)");
  opt(resilience, "--max-restarts", cfg->max_restarts,
      "After a failure (an actor that throws, a rank that dies), restart every actor from the "
      "latest checkpoint in --save up to N times (in one process; under troupe launch give it to "
      "the launcher)");
  opt(resilience, "--distributed-timeout-minutes", cfg->distributed_timeout_minutes,
      "A step, evaluation or save that makes no progress for this long means a rank is stuck: the job "
      "stops naming the ranks that did not finish (fractions allowed)");
  opt(resilience, "--inspect", cfg->inspect,
      "Serve the inspector on [HOST:]PORT (HOST 127.0.0.1 unless given; port 0 picks a free one): "
      "`troupe inspect FILE --exec status` asks it; only a client with the job token is served");
  opt(resilience, "--inspect-file", cfg->inspect_file,
      "Where --inspect writes its address and the job token (mode 0600; default troupe-inspect.json in "
      "--save, else troupe-inspect-PID.json in the working directory)");
  opt(resilience, "--dashboard", cfg->dashboard,
      "Serve a live web page of the job on [HOST:]PORT (HOST 127.0.0.1 unless given; port 0 picks a free "
      "one): each rank's timeline beside the planned schedule, loss/lr/grad-norm curves, utilisation, the "
      "waits; its URL, printed and written into the inspect file, carries the token it needs (starts "
      "--inspect too)");
  cmd->add_flag("--watch-nan", cfg->watch_nan,
                "Stop at the first non-finite loss, gradient or parameter and name where it first appeared "
                "(iteration, micro-batch, rank, layer, tensor, forward or backward), found by replaying the "
                "iteration with a check after every op; writes troupe-nan-PID.json (in --save, else the working "
                "directory). Costs a copy of each rank's parameters and received activations per step")
      ->group(resilience);
  opt(resilience, "--inspect-stall-seconds", cfg->inspect_stall_seconds,
      "When no rank of a process changes what it does for this long, print who waits on whom and the "
      "culprit, and write every rank's activity to troupe-stall-PID.json (in --save, else the working "
      "directory), before --distributed-timeout-minutes acts (0: the smaller of 60 s and half that timeout)");

  const char* logs = "Evaluation and logging";
  opt(logs, "--eval-interval", cfg->eval_interval,
      "Evaluate on the validation split every N iterations");
  opt(logs, "--eval-iters", cfg->eval_iters, "Validation batches per evaluation");
  opt(logs, "--log-interval", cfg->log_interval,
      "Print progress every N iterations: the averages over those iterations, as Megatron");
  opt(logs, "--timing-log-level", cfg->timing_log_level,
      "Megatron's timers printed every log interval: 0 forward-backward and optimizer; 1 also "
      "forward-compute, backward-compute, all-grads-sync, params-all-gather; 2 also the pipeline "
      "waits (forward-recv, backward-recv)")
      ->check(CLI::Range(0, 2));
  opt(logs, "--timing-log-option", cfg->timing_log_option,
      "How the timers are shown over this process's ranks: minmax, max or all (one value per rank)")
      ->check(CLI::IsMember({"minmax", "max", "all"}));
  opt(logs, "--metrics-file", cfg->metrics_file,
      "Append one JSON object per iteration to this file");
  cmd->add_flag("--log-params-norm", cfg->log_params_norm,
                "Also report the L2 norm of the parameters after each step (params norm on the progress line, "
                "params-norm in TensorBoard), as Megatron's flag")
      ->group(logs);
  cmd->add_flag("--log-num-zeros-in-grad", cfg->log_num_zeros_in_grad,
                "Also report how many gradient elements are exactly zero in each step (num zeros on the progress "
                "line, num-zeros in TensorBoard), as Megatron's flag")
      ->group(logs);
  // Megatron's TensorBoard flags (docs/COMPAT.md, "TensorBoard"), with its spellings: the
  // learning-rate switch is --no-log-learnig-rate-to-tensorboard in Megatron (sic); current
  // Megatron-LM also spells the negative switches --disable-*.
  const char* tb = "TensorBoard";
  TensorBoardConfig& t = cfg->tensorboard;
  opt(tb, "--tensorboard-dir", t.dir,
      "Write TensorBoard event files (events.out.tfevents.*) to this directory, created if missing; a resumed run "
      "adds a file beside the earlier ones");
  opt(tb, "--tensorboard-log-interval", t.log_interval,
      "Write the per-iteration scalars (lm loss, learning-rate, batch-size, grad-norm, loss-scale) every N "
      "iterations");
  opt(tb, "--tensorboard-queue-size", t.queue_size,
      "Accepted for Megatron scripts (its writer's queue): troupe writes every iteration's events at once");
  cmd->add_flag("--log-timers-to-tensorboard", t.log_timers,
                "Also write iteration-time, each timer as <name>-time and (with --log-throughput) throughput, "
                "every --log-interval iterations")
      ->group(tb);
  cmd->add_flag("--log-throughput", t.log_throughput,
                "Write throughput (TFLOP/s per rank) with --log-timers-to-tensorboard (the progress line "
                "always shows TFLOP/s)")
      ->group(tb);
  cmd->add_flag("--log-validation-ppl-to-tensorboard", t.log_validation_ppl,
                "Also write the validation perplexity (lm loss validation ppl)")
      ->group(tb);
  cmd->add_flag("--log-world-size-to-tensorboard", t.log_world_size, "Also write world-size (the ranks of the job)")
      ->group(tb);
  cmd->add_flag_callback("--no-log-learnig-rate-to-tensorboard,--no-log-learning-rate-to-tensorboard",
                         [&t] { t.log_learning_rate = false; },
                         "Do not write learning-rate (Megatron's spelling has the typo 'learnig')")
      ->group(tb);
  cmd->add_flag_callback("--no-log-loss-scale-to-tensorboard,--disable-log-loss-scale-to-tensorboard",
                         [&t] { t.log_loss_scale = false; }, "Do not write loss-scale (1: troupe trains in float32)")
      ->group(tb);
  cmd->add_flag("--log-batch-size-to-tensorboard")
      ->description("Accepted for older Megatron scripts: batch-size is always written, as current Megatron-LM does")
      ->group(tb);
  opt(logs, "--timeline", cfg->timeline,
      "Write a Chrome trace (chrome://tracing, Perfetto) of every actor's spans to this file");
  opt(logs, "--num-threads", cfg->num_threads, "Compute threads (0: all cores)");

  opt(logs, "--deepspeed-config,--deepspeed_config", cfg->deepspeed_config,
      "DeepSpeed JSON file; flags given on the command line win over it");
  // Megatron-DeepSpeed scripts pass a bare --deepspeed switch next to the config file: accepted,
  // and meaningless here (troupe always runs its own ZeRO/offload engine).
  cmd->add_flag("--dry-run")
      ->description("Validate everything, print the model and the memory plan of each rank, and exit without "
                    "training")
      ->group(logs);
  cmd->add_flag("--deepspeed")
      ->description("Accepted for Megatron-DeepSpeed scripts; no effect")
      ->group(logs);
  cmd->add_flag("--auto-layout")
      ->description("Choose the layout troupe plan predicts fastest on this machine (the sizes given stay fixed; "
                    "docs/PLAN.md), print it and the runner-up, and train with it")
      ->group(logs);
}

Status finalize_train_config(const CLI::App& cmd, TrainConfig* cfg, int world_size,
                             std::vector<std::string>* notes) {
  // A flag this build does not register (a preset asks after the mixture-of-experts flags) was not given.
  const FlagGivenFn given = [&cmd](const char* flag) {
    const CLI::Option* o = cmd.get_option_no_throw(flag);
    return o != nullptr && o->count() > 0;
  };
  FlagOrigins origins;
  // The data-parallel size DeepSpeed's batch rule and the derived global batch multiply by (an
  // invalid one is reported by validation).
  const int dp = std::max(1, cfg->resolved_dp(std::max(1, world_size)));
  bool global_from_file = false;
  if (given("--deepspeed-config")) {
    TROUPE_RETURN_IF_ERROR(
        merge_deepspeed_config(cfg->deepspeed_config, dp, given, cfg, &origins, &global_from_file, notes));
  }
  // Megatron: --num-layers-per-virtual-pipeline-stage selects the interleaved schedule.
  if (given("--num-layers-per-virtual-pipeline-stage") && !given("--pipeline-schedule")) {
    cfg->pipeline_schedule = "interleaved";
    origins["--pipeline-schedule"] =
        "--num-layers-per-virtual-pipeline-stage, which selects it as in Megatron";
  }
  std::vector<std::string> flag_problems;
  apply_family_flags(cmd, given, cfg->model, flag_problems, notes);
  apply_moe_flags(cmd, given, cfg, &flag_problems, notes);
  apply_precision_flags(given, cfg, &flag_problems, notes);
  apply_tokenizer_flags(cmd, given, cfg, flag_problems, notes);
  // Megatron's LayerNorm 1p stores gamma - 1 and adds the 1 in fp32 inside the norm: a
  // reparameterisation (the same function; the same AdamW steps, since neither Megatron nor troupe
  // decays norm weights: model/params.hpp). In 16 bits the working copy of gamma - 1 (near 0) rounds
  // more finely than troupe's of gamma (near 1), so only a float32 run trains the same.
  if (given("--apply-layernorm-1p")) {
    if (cfg->precision.dtype != PrecisionDType::fp32)
      flag_problems.push_back(
          "--apply-layernorm-1p with a 16-bit run: Megatron keeps gamma - 1 in 16 bits and adds 1 in fp32, which "
          "rounds the norm weights differently from troupe's 16-bit gamma -- drop the flag (the model is the same up "
          "to that rounding) or train in float32");
    else if (notes != nullptr)
      notes->push_back(
          "--apply-layernorm-1p: no effect -- Megatron stores the norm weights as gamma - 1 and adds 1 in "
          "the norm: the same function, and in float32 the same training, since norm weights get no "
          "weight decay in Megatron or troupe (troupe stores gamma itself)");
  }
  // Megatron: sequence parallelism is meaningless without tensor parallelism; silently off.
  if (cfg->tensor_model_parallel_size == 1) cfg->sequence_parallel = false;
  // A preset's table size stays unless --seq-length outgrows it.
  if (!given("--max-position-embeddings") &&
      (!given("--model-preset") || cfg->model.max_position_embeddings < cfg->model.seq_length))
    cfg->model.max_position_embeddings = cfg->model.seq_length;
  // Megatron's default global batch: one micro-batch per data-parallel replica.
  if (!given("--global-batch-size") && !global_from_file) {
    const int64_t global = int64_t{cfg->micro_batch_size} * dp;
    cfg->global_batch_size = global <= INT_MAX ? static_cast<int>(global) : cfg->micro_batch_size;
  }
  // Megatron's update_train_iters (no batch ramp-up): a sample-based run takes
  // train_samples / global_batch_size iterations; Megatron-DeepSpeed's token budget alone, as many
  // as it takes to consume it.
  if (cfg->train_samples > 0) {
    if (given("--train-iters"))
      return Status::bad_input("--train-iters and --train-samples are both given -- give one (Megatron trains by "
                               "iterations or by samples)");
    if (cfg->global_batch_size > 0) cfg->train_iters = cfg->train_samples / cfg->global_batch_size;
    if (cfg->global_batch_size > 0 && cfg->rampup() && cfg->rampup_batch_increment > 0 &&
        cfg->rampup_start_batch <= cfg->global_batch_size && cfg->rampup_samples >= 0 &&
        cfg->rampup_samples / cfg->rampup_start_batch <= 100'000'000) {  // validation refuses longer ramps
      // Megatron's update_train_iters with a ramp-up: the ramp's iterations (while consumed <=
      // ramp-up samples), then whole global batches of what is left (Python's floor division).
      int64_t iterations = 0, consumed = 0;
      while (consumed <= cfg->rampup_samples) {
        consumed += cfg->global_batch_at(consumed);
        ++iterations;
      }
      const int64_t left = cfg->train_samples - consumed, gbs = cfg->global_batch_size;
      iterations += left >= 0 ? left / gbs : -((-left + gbs - 1) / gbs);
      cfg->train_iters = std::max<int64_t>(0, iterations);
    }
  } else if (cfg->rampup() && given("--train-iters") && notes != nullptr) {
    notes->push_back("--rampup-batch-size with --train-iters: Megatron refuses a ramp-up in an iteration-based run; "
                     "troupe trains --train-iters iterations with the ramp's batches, the learning rate counting the "
                     "samples consumed over --lr-decay-iters x --global-batch-size, as Megatron's scheduler does");
  }
  if (cfg->train_samples <= 0 && cfg->train_tokens > 0 && !given("--train-iters")) {
    cfg->train_iters = cfg->iterations_to_run();
  }
  // --load of a Hugging Face folder without tokenizer flags: the folder's own tokenizer.
  if (auto taken = take_hf_folder_tokenizer(*cfg); !taken)
    flag_problems.push_back(taken.status().message());
  else if (!taken->empty() && notes != nullptr)
    notes->push_back(*taken);
  Status st = validate_train_config(*cfg, &origins, {}, std::max(1, world_size));
  if (!flag_problems.empty()) {
    // The family flags' own problems first, then validation's, in one list.
    std::vector<std::string> all = flag_problems;
    if (!st) {
      const std::string sep = "\n  - ";
      const std::string& message = st.message();
      if (message.find(" problems:" + sep) == std::string::npos) {
        all.push_back(message);
      } else {
        for (size_t at = message.find(sep); at != std::string::npos;) {
          const size_t next = message.find(sep, at + sep.size());
          all.push_back(message.substr(at + sep.size(), next == std::string::npos ? next : next - at - sep.size()));
          at = next;
        }
      }
    }
    if (all.size() == 1) return Status::error(all[0]);
    std::string message = fmt::format("{} problems:", all.size());
    for (const std::string& p : all) message += "\n  - " + p;
    return Status::error(message);
  }
  TROUPE_RETURN_IF_ERROR(st);
  return world_size > 1 ? validate_world(*cfg, world_size) : Status::ok();
}

void waive_run_inputs_for_plan(TrainConfig* cfg) {
  cfg->data_path.clear();
  cfg->train_data_path.clear();
  cfg->valid_data_path.clear();
  cfg->test_data_path.clear();
  cfg->mock_data = true;
  cfg->load.clear();
  cfg->save.clear();
  if (cfg->train_iters <= 0 && cfg->train_samples <= 0 && cfg->train_tokens <= 0) cfg->train_iters = 1;
}

}  // namespace troupe
