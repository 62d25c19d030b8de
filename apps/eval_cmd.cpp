// troupe eval: mean next-token loss and perplexity of a checkpoint over the first K windows of a dataset.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>
#include <memory>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "troupe/data_source.hpp"
#include "actors/job.hpp"
#include "config/memory_estimate.hpp"
#include "apps/commands.hpp"
#include "apps/report.hpp"
#include "apps/generation_model.hpp"
#include "kernels/thread_pool.hpp"
#include "model/eval_tasks.hpp"

namespace troupe::apps {

namespace {

struct EvalArgs {
  std::string load;
  std::string data_path;
  std::string task;   // perplexity (WIKITEXT103) or lambada (LAMBADA): the zero-shot tasks
  std::string input;  // their text (perplexity: a text file, or JSONL of {"text"}), or JSONL of {"text"}
  int overlapping_eval = 32;
  int window = 0;     // 0: the model's sequence length
  int64_t eval_samples = 0;
  int micro_batch_size = 8;
  int num_threads = 0;
  bool json = false;
};

// The texts of a JSONL file's "text" fields (a line that is not such an object: bad input naming it).
Result<std::vector<std::string>> read_texts(const std::string& path, bool jsonl) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::bad_input("--input " + path + " cannot be read -- check the path");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() > (size_t{1} << 30)) return Status::bad_input("--input " + path + " is over 1 GiB -- evaluate a part");
  if (!jsonl) return std::vector<std::string>{all};
  std::vector<std::string> texts;
  size_t at = 0;
  int64_t line_no = 0;
  while (at < all.size()) {
    size_t end = all.find('\n', at);
    if (end == std::string::npos) end = all.size();
    const std::string line = all.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      return Status::bad_input(fmt::format("--input {} line {}: not an object with a \"text\" string -- write one "
                                           "{{\"text\": ...}} per line", path, line_no));
    texts.push_back(j["text"].get<std::string>());
  }
  return texts;
}

int run_task(const EvalArgs& a) {
  const std::string name = "eval";
  const bool lambada = a.task == "lambada" || a.task == "LAMBADA";
  if (!lambada && a.task != "perplexity" && a.task != "WIKITEXT103") {
    print_error(name, "--task " + a.task + " is not a task -- use perplexity (Megatron's WIKITEXT103) or lambada (LAMBADA)");
    return kExitUsage;
  }
  if (a.input.empty()) {
    print_error(name, "--task " + a.task + " needs --input FILE -- a text (or JSONL of {\"text\"}) to evaluate on");
    return kExitUsage;
  }
  const bool jsonl = lambada || (a.input.size() > 6 && a.input.compare(a.input.size() - 6, 6, ".jsonl") == 0);
  auto texts = read_texts(a.input, jsonl);
  if (!texts) {
    print_error(name, texts.status());
    return kExitUsage;
  }
  auto loaded = load_generation_model(a.load, -1);
  if (!loaded) {
    print_error(name, loaded.status());
    return exit_code_for(loaded.status());
  }
  SequenceDecoder& decoder = *loaded.value().decoder;
  const Tokenizer& tok = *loaded.value().tokenizer;
  ThreadPool pool(a.num_threads > 0 ? a.num_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  Context ctx;
  ctx.pool = &pool;
  if (lambada) {
    std::vector<LastWordExample> examples;
    for (const std::string& t : texts.value()) {
      std::string text = t;
      while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.pop_back();
      const size_t space = text.rfind(' ');
      if (space == std::string::npos || space == 0) {
        print_error(name, "--input " + a.input + ": a text has no last word after its context -- give texts of two words or more");
        return kExitUsage;
      }
      examples.push_back({tok.encode(text.substr(0, space)), tok.encode(text.substr(space))});
    }
    auto r = last_word_accuracy(ctx, decoder, examples);
    if (!r) {
      print_error(name, r.status());
      return exit_code_for(r.status());
    }
    const double accuracy = r.value().total > 0 ? static_cast<double>(r.value().correct) / r.value().total : 0;
    if (a.json)
      std::printf("%s\n", nlohmann::json{{"task", "lambada"}, {"correct", r.value().correct}, {"total", r.value().total},
                                         {"accuracy", accuracy}, {"each", r.value().each}}.dump().c_str());
    else
      std::printf("troupe eval: LAMBADA-style last-word accuracy %.4f (%lld of %lld) on %s\n", accuracy,
                  static_cast<long long>(r.value().correct), static_cast<long long>(r.value().total), a.input.c_str());
    return kExitOk;
  }
  std::string text;
  for (size_t i = 0; i < texts.value().size(); ++i) text += (i > 0 ? "\n" : "") + texts.value()[i];
  const std::vector<int32_t> ids = tok.encode(text);
  const int window = a.window > 0 ? a.window : decoder.config().seq_length;
  auto r = windowed_loss(ctx, decoder, ids, window, a.overlapping_eval);
  if (!r) {
    print_error(name, r.status().with_context("--input " + a.input + ": "));
    return exit_code_for(r.status());
  }
  int64_t words = 0;
  bool in_word = false;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  const double loss = r.value().loss_sum / static_cast<double>(r.value().scored);
  const double bytes = static_cast<double>(text.size());
  const nlohmann::json j = {{"task", "perplexity"}, {"loss", loss}, {"token_ppl", std::exp(loss)},
                            {"byte_ppl", std::exp(r.value().loss_sum / bytes)},
                            {"bits_per_byte", r.value().loss_sum / bytes / std::log(2.0)},
                            {"word_ppl", words > 0 ? std::exp(r.value().loss_sum / static_cast<double>(words)) : 0.0},
                            {"tokens", r.value().scored}, {"bytes", text.size()}, {"words", words},
                            {"windows", r.value().windows}, {"window", window}, {"overlapping_eval", a.overlapping_eval}};
  if (a.json)
    std::printf("%s\n", j.dump().c_str());
  else
    std::printf("troupe eval: perplexity on %s: loss %.6f per token | token ppl %.4f | word ppl %.4f | %.4f bits per byte "
                "| %lld tokens in %lld windows of %d (last %d of each scored)\n",
                a.input.c_str(), loss, std::exp(loss), j["word_ppl"].get<double>(), j["bits_per_byte"].get<double>(),
                static_cast<long long>(r.value().scored), static_cast<long long>(r.value().windows), window,
                a.overlapping_eval);
  return kExitOk;
}

int run_eval(const EvalArgs& a) {
  const std::string name = "eval";
  if (!a.task.empty()) return run_task(a);
  if (a.data_path.empty()) {
    print_error(name, "--data-path is required -- give a dataset prefix, or --task perplexity|lambada --input FILE");
    return kExitUsage;
  }
  auto cfg = checkpoint_config(a.load);
  if (!cfg) {
    print_error(name, cfg.status().with_context("--load " + a.load + ": "));
    return kExitUsage;
  }
  if (a.micro_batch_size <= 0) {
    print_error(name, "--micro-batch-size must be positive -- pass e.g. --micro-batch-size 8");
    return kExitUsage;
  }
  if (a.eval_samples < 0) {
    print_error(name, "--eval-samples must be positive -- omit it to evaluate every window");
    return kExitUsage;
  }
  const GptConfig& model = cfg.value().model;
  // The model eval builds (one shard, --micro-batch-size windows at a time) must fit.
  TrainConfig sized = cfg.value();
  sized.micro_batch_size = sized.global_batch_size = a.micro_batch_size;
  sized.tensor_model_parallel_size = sized.pipeline_model_parallel_size = sized.data_parallel_size = 1;
  sized.context_parallel_size = sized.ds_sequence_parallel_size = 1;
  sized.zero_stage = 0;
  sized.offload_optimizer = "none";
  sized.recompute_granularity = "none";
  if (Status st = check_memory(sized, 1, 1, available_memory_bytes()); !st) {
    print_error(name, st);
    return kExitUsage;
  }
  auto data = open_indexed_data_unsplit(a.data_path, model.seq_length, model.vocab_size);
  if (!data) {
    print_error(name, data.status().with_context("--data-path " + a.data_path + ": "));
    return kExitUsage;
  }
  auto result = run_evaluation(a.load, data.value(), a.eval_samples, a.micro_batch_size, a.num_threads);
  if (!result) {
    print_error(name, result.status());
    return exit_code_for(result.status());
  }
  const EvalSummary& r = result.value();
  if (a.json) {
    nlohmann::json j = {{"loss", r.loss},       {"perplexity", r.perplexity}, {"tokens", r.tokens},
                        {"samples", r.samples}, {"iteration", r.iteration},   {"checkpoint", a.load},
                        {"data_path", a.data_path}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", fmt::format("troupe eval: checkpoint {} (iteration {}) on {}: loss {:.6f} | perplexity {:.4f} | "
                                    "{} windows, {} tokens",
                                    a.load, r.iteration, a.data_path, r.loss, r.perplexity, r.samples, r.tokens)
                            .c_str());
  }
  return kExitOk;
}

}  // namespace

void add_eval_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Mean next-token loss and perplexity of a checkpoint on a dataset");
  cmd->add_option("--load", args->load, "checkpoint directory (as written by --save)")->required();
  cmd->add_option("--data-path", args->data_path, "dataset prefix (PREFIX.bin / PREFIX.idx)");
  cmd->add_option("--task", args->task, "a zero-shot task instead: perplexity (Megatron's WIKITEXT103) or lambada");
  cmd->add_option("--input", args->input, "the task's text: a text file or JSONL of {\"text\"} (lambada: JSONL)");
  cmd->add_option("--overlapping-eval", args->overlapping_eval, "perplexity: tokens scored per window (Megatron's)")
      ->capture_default_str();
  cmd->add_option("--window", args->window, "perplexity: window length (default: the model's sequence length)");
  cmd->add_option("--eval-samples", args->eval_samples,
                  "evaluate the first K windows of seq_length+1 tokens (default: all windows)");
  cmd->add_option("--micro-batch-size", args->micro_batch_size, "windows per forward pass")->capture_default_str();
  cmd->add_option("--num-threads", args->num_threads, "compute threads (0: all cores)")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object {loss, perplexity, tokens, ...}");
  cmd->callback([args, exit_code] { *exit_code = run_eval(*args); });
}

}  // namespace troupe::apps
