// `troupe preprocess` on an arbitrary input file (run_preprocess): JSONL records or plain text,
// tokenised and written as MMIDIDX datasets. The first byte picks the options (bits 0-1: input
// format auto / jsonl / text / auto, bit 2: --text-separator %, bit 3: --append-eod, bit 4: GPT-2
// BPE (fuzz/data/gpt2_tiny) instead of bytes, bit 5: --json-keys text title, bit 6: 2 workers (1 under
// TROUPE_FUZZ_ONE_THREAD, which fuzz/run.sh --runs sets: threads' interleaving changes the coverage
// libFuzzer sees, and those runs must repeat themselves), bit 7:
// --split-sentences, with --keep-newlines when the input's length is even); the rest is the input.
// Property: every dataset it writes opens and holds the documents, sequences and tokens the summary
// reports (empty documents included).
#include <cstdlib>
#include <filesystem>

#include "fuzz/fuzz_targets.hpp"
#include "fuzz/fuzz_util.hpp"
#include "storage/indexed_dataset.hpp"
#include "storage/preprocess.hpp"

namespace troupe::fuzz {

Status preprocess_input(const uint8_t* data, size_t size) {
  const uint8_t flags = size > 0 ? data[0] : 0;
  const std::string_view input =
      size > 0 ? std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)
               : std::string_view();
  PreprocessOptions o;
  o.input = write_scratch("input.txt", input);
  o.output_prefix = scratch_dir() + "/out";
  static const char* const kFormats[] = {"auto", "jsonl", "text", "auto"};
  o.input_format = kFormats[flags & 3];
  if (flags & 4) o.text_separator = "%";
  o.append_eod = (flags & 8) != 0;
  if (flags & 16) {
    o.tokenizer_type = "GPT2BPETokenizer";
    o.vocab_file = source_path("fuzz/data/gpt2_tiny/encoder.json");
    o.merge_file = source_path("fuzz/data/gpt2_tiny/vocab.bpe");
  } else {
    o.tokenizer_type = "ByteLevelTokenizer";
  }
  if (flags & 32) o.json_keys = {"text", "title"};
  static const bool one_thread = std::getenv("TROUPE_FUZZ_ONE_THREAD") != nullptr;
  o.workers = (flags & 64) && !one_thread ? 2 : 1;
  o.split_sentences = (flags & 128) != 0;
  o.keep_newlines = size % 2 == 0;

  auto summary = run_preprocess(o, [](const PreprocessProgress&) {});
  if (!summary) return summary.status();
  for (const PreprocessOutput& out : summary->outputs) {
    auto ds = IndexedDataset::open(out.prefix);
    TROUPE_CHECK(ds.is_ok(), "troupe preprocess wrote a dataset its reader refuses");
    TROUPE_CHECK((*ds)->num_documents() == out.documents && (*ds)->num_sequences() == out.sequences &&
                     (*ds)->total_tokens() == out.tokens,
                 "the written dataset differs from the summary");
    std::error_code ec;
    std::filesystem::remove(bin_path(out.prefix), ec);
    std::filesystem::remove(idx_path(out.prefix), ec);
  }
  return Status::ok();
}

}  // namespace troupe::fuzz
