// troupe generate: text from a checkpoint (docs/SERVE.md). Megatron's names for the sampling
// (--tokens-to-generate, --top-k, --top-p, --temperature, --seed); the checkpoint's own tokenizer;
// every prompt its own sequence in the decoder's cache, all generated together.
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "actors/decode_actors.hpp"
#include "actors/job.hpp"
#include "apps/commands.hpp"
#include "apps/generation_model.hpp"
#include "apps/report.hpp"
#include "comm/bootstrap/launch_env.hpp"
#include "comm/ucx/ucx_world.hpp"
#include "kernels/thread_pool.hpp"
#include "model/generation.hpp"
#include "config/imported_config.hpp"
#include "storage/checkpoint.hpp"
#include "storage/hf_import.hpp"
#include "storage/prompts_file.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::apps {

namespace {

// Whether `model` can be decoded on the layout (before its weights are read, where that can be).
Status check_layout(const std::string& dir, const GptConfig& model, const DecodeLayout& layout) {
  std::string why = check_decoder_layout(model, layout.tp, layout.pp, layout.ep > 1);
  if (layout.ep > 1 && layout.ep != layout.tp)
    why += std::string(why.empty() ? "" : "; ") +
           fmt::format("--expert-model-parallel-size {} is not the tensor-parallel size {}: decoding spreads the "
                       "experts over the tensor-parallel group -- give {} or 1",
                       layout.ep, layout.tp, layout.tp);
  const std::string both = layout.bf16 && layout.fp16 ? "--bf16 and --fp16 are both set -- give one of them" : "";
  if (why.empty() && both.empty()) return Status::ok();
  if (why.empty()) return Status::bad_input(both);
  const std::string also = both.empty() ? "" : "; and " + both;
  if (layout.tp * layout.pp == 1) return Status::bad_input("--load " + dir + ": " + why + also);
  return Status::bad_input(fmt::format("--load {}: its model cannot be decoded on --tensor-model-parallel-size {} x "
                                       "--pipeline-model-parallel-size {}: {}{}",
                                       dir, layout.tp, layout.pp, why, also));
}

// A Hugging Face folder (storage/hf_import.hpp): its config and tokenizer as `troupe train --load`
// imports them, its weights straight into the decoder.
Result<GenerationModel> load_hf_generation_model(const std::string& dir, const DecodeLayout& layout) {
  auto model = read_hf_folder(dir);
  if (!model) return model.status().as_bad_input();
  const TrainConfig c = imported_train_config(model.value());
  if (Status st = check_layout(dir, c.model, layout); !st) return st;
  if (c.tokenizer_type.empty())
    return Status::bad_input("--load " + dir + ": the folder names no tokenizer troupe reads (no vocab.json and "
                             "merges.txt, no troupe export) -- generate from a troupe checkpoint of it (troupe ckpt "
                             "import --format hf) with --tokenizer flags at import");
  auto tokenizer = make_tokenizer(c.tokenizer_type, c.vocab_file, c.merge_file, c.tokenizer_model);
  if (!tokenizer) return tokenizer.status().with_context("the folder's tokenizer: ").as_bad_input();
  GenerationModel out;
  auto decoder = std::make_unique<Decoder>(c.model);
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : model.value().params) by_name[t.name] = &t;
  for (size_t i = 0; i < decoder->specs().size(); ++i) {
    const ParamSpec& spec = decoder->specs()[i];
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) return Status::bad_input("--load " + dir + ": the folder has no " + spec.name);
    const Tensor& src = it->second->tensor;
    const Tensor& dst = decoder->params()[i];
    dst.rows(0, src.dim(0)).copy_from(src);  // wte: the padding rows stay zero
  }
  out.decoder = std::move(decoder);
  out.tokenizer = std::move(tokenizer).value();
  return out;
}

}  // namespace

namespace {

Result<GenerationModel> load_whole_generation_model(const std::string& dir, int64_t iteration, const DecodeLayout& layout) {
  if (is_hf_folder(dir)) return load_hf_generation_model(dir, layout);
  auto cfg = checkpoint_config(dir);
  if (!cfg) return cfg.status().with_context("--load " + dir + ": ").as_bad_input();
  const TrainConfig& c = cfg.value();
  if (Status st = check_layout(dir, c.model, layout); !st) return st;
  auto tokenizer = make_tokenizer(c.tokenizer_type, c.vocab_file, c.merge_file, c.tokenizer_model);
  if (!tokenizer) return tokenizer.status().with_context("the checkpoint's tokenizer: ").as_bad_input();
  if (tokenizer.value()->vocab_size() != c.model.vocab_size)
    return Status::bad_input(fmt::format("the tokenizer ({}) has {} tokens, the checkpoint's model {} -- generate with the "
                                         "tokenizer the model was trained with",
                                         tokenizer.value()->name(), tokenizer.value()->vocab_size(), c.model.vocab_size));
  auto checkpoint = iteration < 0 ? Checkpoint::open_latest(dir) : Checkpoint::open(dir, iteration);
  if (!checkpoint) return checkpoint.status().with_context("--load " + dir + ": ").as_bad_input();
  GenerationModel out;
  auto decoder = std::make_unique<Decoder>(c.model);
  CheckpointContents contents;
  for (size_t i = 0; i < decoder->specs().size(); ++i)
    contents.params.push_back({decoder->specs()[i].name, decoder->specs()[i].global_shape, decoder->params()[i]});
  if (Status st = checkpoint.value().load(contents, /*load_optimizer=*/false); !st) return st.with_context("--load " + dir + ": ");
  out.decoder = std::move(decoder);
  out.tokenizer = std::move(tokenizer).value();
  out.iteration = checkpoint.value().iteration();
  return out;
}

}  // namespace

Result<GenerationModel> load_generation_model(const std::string& dir, int64_t iteration, const DecodeLayout& layout_in) {
  DecodeLayout layout = layout_in;
  if (layout.bf16) layout.dtype = DType::bf16;
  if (layout.fp16) layout.dtype = DType::f16;
  auto loaded = load_whole_generation_model(dir, iteration, layout);
  if (!loaded) return loaded;
  if (layout.tp * layout.pp == 1 && layout.dtype == DType::f32 && !layout.world) {  // this decoder decodes
    dynamic_cast<Decoder&>(*loaded.value().decoder).pack_weights();
    return loaded;
  }
  GenerationModel out = std::move(loaded).value();
  const auto* whole = dynamic_cast<const Decoder*>(out.decoder.get());
  if (layout.tp * layout.pp == 1 && !layout.world) {  // one 16-bit decoder, its values the f32 ones rounded
    auto half = std::make_unique<Decoder>(whole->config(), layout.dtype);
    half->load_from(*whole);
    out.decoder = std::move(half);
    return out;
  }
  // The whole model read once, then split over the shard actors, each copying its slice.
  const ParallelDecodeOptions options{layout.tp, layout.pp, layout.num_threads, 0, layout.dtype, layout.ep > 1};
  auto parallel = layout.world ? ParallelDecoder::create_distributed(*whole, options, layout.world)
                               : ParallelDecoder::create(*whole, options);
  if (!parallel) return parallel.status().with_context("--load " + dir + ": ");
  out.decoder = std::move(parallel).value();
  return out;
}

Result<DecodeProcesses> join_decode_processes(DecodeLayout& layout, int num_threads) {
  DecodeProcesses out;
  auto env = comm::detect_launch_env();
  if (!env) return env.status().as_bad_input();
  if (env.value().world_size <= 1) return out;
  auto bootstrap = comm::create_caf_bootstrap(env.value());
  if (!bootstrap) return bootstrap.status();
  auto world = comm::create_ucx_world(*bootstrap.value());
  if (!world) return world.status();
  out.bootstrap = std::move(bootstrap).value();
  out.world = std::move(world).value();
  out.local_world_size = std::max(1, env.value().local_world_size);
  layout.world = out.world;
  if (num_threads <= 0)  // this process's share of the host's cores
    layout.num_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / out.local_world_size);
  return out;
}

int follow_decode(const std::string& name, const std::string& dir, int64_t iteration, const DecodeLayout& layout_in,
                  const DecodeProcesses& procs) {
  DecodeLayout layout = layout_in;
  if (layout.bf16) layout.dtype = DType::bf16;
  if (layout.fp16) layout.dtype = DType::f16;
  auto loaded = load_whole_generation_model(dir, iteration, layout);
  Status st = loaded.status();
  if (loaded) {
    const auto& whole = dynamic_cast<const Decoder&>(*loaded.value().decoder);
    st = run_decode_follower(whole, {layout.tp, layout.pp, layout.num_threads, 0, layout.dtype, layout.ep > 1}, procs.world);
  }
  if (st) return kExitOk;
  print_error(name, st.with_context("rank " + std::to_string(procs.world->rank()) + ": "));
  return exit_code_for(st);
}

void add_decode_layout_options(CLI::App* cmd, DecodeLayout& layout) {
  cmd->add_option("--tensor-model-parallel-size", layout.tp, "decode on this many tensor-parallel shard actors")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--pipeline-model-parallel-size", layout.pp,
                  "decode on this many pipeline stages (a feed's sequences flow through them in micro-batches)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--expert-model-parallel-size", layout.ep,
                  "1: each expert split over the tensor-parallel ranks like the MLP; the tensor-parallel size: "
                  "the experts whole, spread over those ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--bf16", layout.bf16, "decode in bf16: weights, activations and the cache (the 16-bit forward)");
  cmd->add_flag("--fp16", layout.fp16, "decode in fp16: weights, activations and the cache (the 16-bit forward)");
}

namespace {

struct GenerateArgs {
  std::string load;
  int64_t iteration = -1;
  std::vector<std::string> prompts;
  std::string prompts_file;
  int tokens_to_generate = 64;
  int top_k = 0;
  double top_p = 0;
  double temperature = 1.0;
  uint64_t seed = 0;
  std::vector<int> stop_tokens;
  std::vector<std::string> stop_strings;
  bool no_stop_on_eod = false;
  bool logprobs = false;
  bool json = false;
  bool timing = false;
  int num_threads = 0;
  int beam_width = 0;
  double length_penalty = 1.0;
  DecodeLayout layout;
};

int run_generate(const GenerateArgs& a) {
  const std::string name = "generate";
  std::vector<std::string> prompts = a.prompts;
  if (!a.prompts_file.empty()) {
    auto read = read_prompts_file(a.prompts_file);
    if (!read) {
      print_error(name, read.status());
      return kExitUsage;
    }
    prompts.insert(prompts.end(), read.value().begin(), read.value().end());
  }
  DecodeLayout layout = a.layout;
  layout.num_threads = a.num_threads;
  // Under troupe launch: one process per rank; rank 0 generates, the others follow it.
  auto procs = join_decode_processes(layout, a.num_threads);
  if (!procs) {
    print_error(name, procs.status());
    return exit_code_for(procs.status());
  }
  if (procs.value().follower()) return follow_decode(name, a.load, a.iteration, layout, procs.value());
  auto loaded = load_generation_model(a.load, a.iteration, layout);
  if (!loaded) {
    print_error(name, loaded.status());
    return exit_code_for(loaded.status());
  }
  SequenceDecoder& decoder = *loaded.value().decoder;
  const Tokenizer& tok = *loaded.value().tokenizer;
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) ids.push_back(tok.encode(p));

  if (a.beam_width > 0) {
    // Megatron's beam search: one prompt, every hypothesis best first.
    if (ids.size() != 1) {
      print_error(name, fmt::format("--beam-width searches one prompt, {} given -- give one --prompt", ids.size()));
      return kExitUsage;
    }
    ThreadPool pool(a.num_threads > 0 ? a.num_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
    Context ctx;
    ctx.pool = &pool;
    auto hyps = beam_search(ctx, decoder, ids[0], a.beam_width, a.tokens_to_generate, a.no_stop_on_eod ? -1 : tok.eod(),
                            a.length_penalty);
    if (!hyps) {
      print_error(name, hyps.status());
      return exit_code_for(hyps.status());
    }
    if (a.json) {
      nlohmann::json beams = nlohmann::json::array();
      for (const BeamHypothesis& h : hyps.value())
        beams.push_back({{"text", tok.decode(h.tokens)}, {"tokens", h.tokens}, {"score", h.score}});
      std::printf("%s\n", nlohmann::json{{"prompt", prompts[0]}, {"prompt_tokens", ids[0]}, {"beams", beams}}
                               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s%s\n", prompts[0].c_str(), tok.decode(hyps.value().front().tokens).c_str());
    }
    return kExitOk;
  }
  GenerationOptions options;
  options.sampling = {a.top_k, a.top_p, a.temperature, a.seed};
  options.tokens_to_generate = a.tokens_to_generate;
  options.prompt_log_probs = a.json && a.logprobs;  // printed only then
  options.stop_tokens.assign(a.stop_tokens.begin(), a.stop_tokens.end());
  if (!a.no_stop_on_eod) options.stop_tokens.push_back(tok.eod());
  if (!a.stop_strings.empty())
    options.stop = [&](size_t, const std::vector<int32_t>& generated) {
      const std::string text = tok.decode(generated);
      for (const std::string& s : a.stop_strings)
        if (!s.empty() && text.find(s) != std::string::npos) return true;
      return false;
    };
  ThreadPool pool(a.num_threads > 0 ? a.num_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  Context ctx;
  ctx.pool = &pool;
  GenerationTimes times;
  auto result = generate(ctx, decoder, ids, options, &times);
  if (!result) {
    print_error(name, result.status());
    return exit_code_for(result.status());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Generation& g = result.value()[i];
    std::string text = tok.decode(g.tokens);
    if (g.finish_reason == "stop")  // cut at the first stop string
      for (const std::string& s : a.stop_strings)
        if (size_t at = text.find(s); !s.empty() && at != std::string::npos) text.resize(at);
    if (a.json) {
      nlohmann::json j = {{"prompt", prompts[i]}, {"prompt_tokens", ids[i]}, {"text", text}, {"tokens", g.tokens},
                          {"finish_reason", g.finish_reason}};
      if (a.logprobs) {
        j["log_probs"] = g.log_probs;
        j["prompt_log_probs"] = g.prompt_log_probs;
      }
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s%s\n", prompts[i].c_str(), text.c_str());
      if (prompts.size() > 1 && i + 1 < prompts.size()) std::printf("\n");
    }
  }
  if (a.timing)
    std::fprintf(stderr, "troupe generate: %zu prompts: prompts fed in %.4f s (time to first token); %lld tokens in %.4f s "
                         "(%.1f tokens/s)\n",
                 prompts.size(), times.prefill_seconds, static_cast<long long>(times.tokens), times.decode_seconds,
                 times.decode_seconds > 0 ? static_cast<double>(times.tokens) / times.decode_seconds : 0.0);
  return kExitOk;
}

}  // namespace

void add_generate_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a checkpoint (Megatron's sampling; docs/SERVE.md)");
  cmd->add_option("--load", a->load, "checkpoint directory (as written by --save)")->required();
  cmd->add_option("--iteration", a->iteration, "the checkpoint's iteration (default: the latest)");
  cmd->add_option("--prompt", a->prompts, "a prompt (repeat for several, generated together)");
  cmd->add_option("--prompts-file", a->prompts_file, "JSONL: one prompt per line, a string or {\"prompt\": ...}");
  cmd->add_option("--tokens-to-generate", a->tokens_to_generate, "tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "1: greedy; k > 1: sample from the k most probable; 0: off")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "(0, 1]: sample from the smallest set reaching this mass; 0: off")
      ->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "divides the logits before sampling (> 0)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "sampling seed: the same seed gives the same text")->capture_default_str();
  cmd->add_option("--stop-token", a->stop_tokens, "a token id that ends a sequence (repeatable; EOD always, unless "
                                                  "--no-stop-on-eod)");
  cmd->add_option("--stop-string", a->stop_strings, "text that ends a sequence, cut from the output (repeatable)");
  cmd->add_flag("--no-stop-on-eod", a->no_stop_on_eod, "keep generating past the end-of-document token");
  cmd->add_flag("--logprobs", a->logprobs, "with --json: each token's log-probability (prompt and generated)");
  cmd->add_flag("--json", a->json, "one JSON object per prompt: prompt, text, tokens, finish_reason");
  cmd->add_option("--num-threads", a->num_threads, "compute threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--timing", a->timing, "print to stderr the time to first token and the decode rate");
  cmd->add_option("--beam-width", a->beam_width, "beam search with this many beams (one prompt; Megatron's)");
  cmd->add_option("--length-penalty", a->length_penalty, "beam search: scores are sum / length^this")->capture_default_str();
  add_decode_layout_options(cmd, a->layout);
  cmd->callback([a, exit_code] { *exit_code = run_generate(*a); });
}

}  // namespace troupe::apps
