// `troupe preprocess`: text -> Megatron indexed datasets (tools/preprocess_data.py semantics).
//
// Input formats:
//   jsonl  one JSON object per line (blank lines are skipped); each --json-keys key holds a string
//          document. Each key is tokenised into its own dataset PREFIX_{key}_document.{bin,idx}.
//   text   plain text; documents are separated by one or more blank lines (text_separator empty) or
//          end at each line equal to text_separator (e.g. "%" for fortune files). A document's text
//          is its lines as they appear in the file, newlines included. Key "text":
//          PREFIX_text_document.
//   auto   jsonl when the first non-blank character of the file is '{', else text.
// Each document is one sequence, or with split_sentences one sequence per sentence
// (split_sentences below; the outputs are then PREFIX_{key}_sentence, Megatron's name). As in
// Megatron's tools/preprocess_data.py (Encoder.encode, IndexedDatasetBuilder.add_document), a
// sentence that tokenises to nothing is no sequence, and a document with no tokens is kept as a
// document of no sequences (its doc_idx entry repeats the one before); with append_eod the
// tokenizer's EOD id ends every document that has tokens (its last sentence). The dtype is uint16
// when the vocabulary has fewer than 65500 ids, else int32 (Megatron's rule).
//
// Failure: bad options, a missing input, malformed JSON on line N, a missing or non-string key on
// line N: an error naming the file / line / key and the fix, and nothing is written (outputs go to
// temporary names and are renamed only once every dataset is complete; earlier outputs under the
// same prefix stay untouched). Output does not depend on `workers`.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/status.hpp"
#include "storage/indexed_dataset.hpp"

namespace troupe {

struct PreprocessOptions {
  std::string input;
  std::string output_prefix;
  std::string tokenizer_type;
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_model;  // --tokenizer-model: SentencePiece model, or tokenizer.json / its folder
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  std::string input_format = "auto";  // "auto" | "jsonl" | "text"
  std::string text_separator;         // text mode: "" = blank lines separate documents
  int workers = 1;                    // tokenizer threads
  bool split_sentences = false;       // one sequence per sentence (split_sentences below)
  bool keep_newlines = false;         // with split_sentences: whitespace after a sentence stays in it
  int partitions = 1;                 // Megatron's --partitions: accepted; the output is the same
  int64_t log_interval = 0;           // a progress line every N records (0: about every 2 s)
};

// The sentences of `text`, a documented stand-in for NLTK's punkt (which Megatron uses and is not
// available here; docs/DATA.md, "Sentences"): a sentence ends after a run of '.', '!' or '?'
// (and any closing quotes or brackets after it) that is followed by whitespace and then by
// something other than a lowercase ASCII letter, unless the word ending in '.' is a single letter
// (an initial) or one of a few abbreviations (Mr., Dr., e.g., ...). The whitespace between two
// sentences is dropped, or with keep_newlines stays at the end of the sentence before it (as
// Megatron's CustomLanguageVars keeps it). The whitespace at the start and end of the text stays with
// the first and last sentence. Concatenating the sentences with keep_newlines gives back `text`.
std::vector<std::string> split_sentences(const std::string& text, bool keep_newlines);

struct PreprocessProgress {
  int64_t documents = 0;  // input records (JSON lines / text documents) read so far
  int64_t bytes_read = 0;
  int64_t input_bytes = 0;  // size of the input file
  double seconds = 0;
};
// Called about every 2 s while preprocessing runs (every log_interval records when that is set).
using PreprocessProgressFn = std::function<void(const PreprocessProgress&)>;

struct PreprocessOutput {
  std::string key;
  std::string prefix;  // PREFIX_{key}_document (or _sentence); the files are prefix + ".bin" / ".idx"
  int64_t documents = 0;  // empty ones included
  int64_t sequences = 0;
  int64_t tokens = 0;
  IndexDType dtype = IndexDType::u16;
};

struct PreprocessSummary {
  std::string format;   // the format used: "jsonl" or "text"
  int64_t records = 0;  // input records read (JSON lines / text documents, empty ones included)
  int64_t input_bytes = 0;
  double seconds = 0;
  std::vector<PreprocessOutput> outputs;  // one per key, in --json-keys order
};

// "PREFIX_{key}_document" ("_sentence" with split_sentences), Megatron's output name.
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key,
                                     bool split_sentences = false);

// Checks the options without reading the input: flags, tokenizer files, input present, output
// directory present. Errors here are usage errors.
Status validate_preprocess_options(const PreprocessOptions& options);

// Validates, then tokenises the whole input and writes the datasets. Without a progress callback,
// progress lines go to stderr (about every 2 s, only for runs that take that long).
Result<PreprocessSummary> run_preprocess(const PreprocessOptions& options,
                                         const PreprocessProgressFn& progress = nullptr);

}  // namespace troupe
