// `troupe preprocess`: flags as Megatron's tools/preprocess_data.py names them; the work is in
// storage/preprocess.hpp.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "apps/commands.hpp"
#include "storage/preprocess.hpp"
#include "storage/tokenizer.hpp"

namespace troupe::apps {
namespace {

struct PreprocessFlags {
  PreprocessOptions options;
  std::string dataset_impl = "mmap";
  std::string lang = "english";
};

int run_preprocess_command(const PreprocessFlags& flags) {
  auto fail = [](const std::string& message, int code) {
    fmt::print(stderr, "troupe preprocess: error: {}\n", message);
    return code;
  };
  if (flags.dataset_impl != "mmap") {
    return fail(
        "--dataset-impl '" + flags.dataset_impl +
            "' is not supported -- troupe reads and writes only Megatron's mmap format; pass "
            "--dataset-impl mmap or leave it out",
        kExitUsage);
  }
  Status valid = validate_preprocess_options(flags.options);
  if (!valid) return fail(valid.message(), kExitUsage);
  auto summary = run_preprocess(flags.options);
  if (!summary) return fail(summary.status().message(), exit_code_for(summary.status()));

  fmt::print("troupe preprocess: {} input ({} records, {:.1f} MB) in {:.2f} s, tokenizer {}\n",
             summary->format, summary->records, double(summary->input_bytes) / 1e6,
             summary->seconds, flags.options.tokenizer_type);
  for (const PreprocessOutput& out : summary->outputs) {
    fmt::print("  key '{}': {} documents, {} {}, {} tokens ({}) -> {}.bin, {}.idx\n", out.key, out.documents,
               out.sequences, flags.options.split_sentences ? "sentences" : "sequences", out.tokens,
               index_dtype_name(out.dtype), out.prefix, out.prefix);
  }
  return kExitOk;
}

}  // namespace

void add_preprocess_command(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<PreprocessFlags>();
  PreprocessOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "preprocess",
      "Tokenise JSONL or plain text into Megatron mmap indexed datasets (PREFIX_{key}_document)");
  cmd->add_option("--input", o.input, "Input file: JSONL (one JSON object per line) or plain text")
      ->required();
  cmd->add_option("--output-prefix", o.output_prefix,
                  "Output prefix; writes PREFIX_{key}_document.bin/.idx")
      ->required();
  cmd->add_option("--tokenizer-type", o.tokenizer_type, std::string("One of: ") + kTokenizerTypes)
      ->required();
  cmd->add_option("--vocab-file", o.vocab_file, "GPT2BPETokenizer: encoder.json");
  cmd->add_option("--merge-file", o.merge_file, "GPT2BPETokenizer: vocab.bpe");
  cmd->add_option("--tokenizer-model", o.tokenizer_model,
                  "GPTSentencePieceTokenizer, Llama2Tokenizer: the SentencePiece model; HuggingFaceTokenizer: "
                  "the folder holding tokenizer.json (and tokenizer_config.json) or tokenizer.json itself");
  cmd->add_option("--json-keys", o.json_keys, "JSONL keys to tokenise, each into its own dataset")
      ->expected(1, -1)
      ->capture_default_str();
  cmd->add_flag("--append-eod", o.append_eod, "Append the end-of-document id to every document");
  cmd->add_option("--workers", o.workers, "Tokenizer threads (output does not depend on it)")
      ->capture_default_str();
  cmd->add_option("--dataset-impl", flags->dataset_impl,
                  "Only mmap (Megatron's MMIDIDX) is supported")
      ->capture_default_str();
  cmd->add_option("--input-format", o.input_format,
                  "auto (JSONL when the file starts with '{'), jsonl or text")
      ->capture_default_str();
  cmd->add_option(
      "--text-separator", o.text_separator,
      "Text mode: a line equal to this ends a document (default: blank lines separate documents)");
  cmd->add_flag("--split-sentences", o.split_sentences,
                "One sequence per sentence (PREFIX_{key}_sentence): troupe's simple splitter, not NLTK punkt "
                "(docs/DATA.md, \"Sentences\")");
  cmd->add_flag("--keep-newlines", o.keep_newlines,
                "With --split-sentences: the whitespace after a sentence (newlines included) stays in it");
  cmd->add_option("--lang", flags->lang, "Accepted for Megatron scripts; the sentence splitter is the same for all")
      ->capture_default_str();
  cmd->add_option("--partitions", o.partitions,
                  "Accepted for Megatron scripts: one pass over the input, the output the same for any N (Megatron's "
                  "with --keep-sequential-samples)")
      ->capture_default_str();
  cmd->add_flag("--keep-sequential-samples")
      ->description("Accepted for Megatron scripts: troupe always keeps the input's order");
  cmd->add_option("--log-interval", o.log_interval,
                  "A progress line on stderr every N documents (default: about every 2 s on long inputs)");
  cmd->callback([flags, exit_code] { *exit_code = run_preprocess_command(*flags); });
}

}  // namespace troupe::apps
