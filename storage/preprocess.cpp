#include "storage/preprocess.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "kernels/thread_pool.hpp"
#include "storage/json_input.hpp"
#include "storage/tokenizer.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Records are tokenised in batches: large enough to keep the workers busy, small enough to bound
// memory and keep progress timely.
constexpr size_t kBatchRecords = 2048;
constexpr size_t kBatchBytes = 8 << 20;

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

// One input record: one text per key (text mode: one text), where it starts and its bytes.
struct Record {
  int64_t line = 0;
  int64_t bytes = 0;
  std::vector<std::string> texts;
};

// Reads records from the input, one batch at a time.
class RecordReader {
 public:
  RecordReader(const PreprocessOptions& options, bool jsonl) : options_(options), jsonl_(jsonl) {}

  Status open() {
    in_.rdbuf()->pubsetbuf(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    in_.open(options_.input, std::ios::binary);
    if (!in_) {
      return Status::error("--input '" + options_.input + "' cannot be read (" +
                           std::strerror(errno) + ") -- check the path");
    }
    return Status::ok();
  }

  // Appends up to a batch of records; sets *done at the end of the input.
  Status next_batch(std::vector<Record>* batch, bool* done) {
    batch->clear();
    size_t bytes = 0;
    *done = false;
    while (batch->size() < kBatchRecords && bytes < kBatchBytes) {
      if (!std::getline(in_, line_)) {
        if (in_.bad()) {
          return Status::error("--input '" + options_.input + "': read failed (" +
                               std::strerror(errno) + ") -- check the file");
        }
        if (!jsonl_ && !pending_.texts.empty() && !pending_.texts[0].empty()) {
          batch->push_back(std::move(pending_));
        }
        *done = true;
        return Status::ok();
      }
      ++line_no_;
      bool newline = !in_.eof();  // the last line may lack its newline; keep the text exact
      bytes_read_ += static_cast<int64_t>(line_.size()) + (newline ? 1 : 0);
      bytes += line_.size() + 1;
      if (jsonl_) {
        if (is_blank(line_)) continue;
        batch->emplace_back();
        batch->back().bytes = static_cast<int64_t>(line_.size()) + (newline ? 1 : 0);
        TROUPE_RETURN_IF_ERROR(parse_json_line(&batch->back()));
      } else {
        pending_.bytes += static_cast<int64_t>(line_.size()) + (newline ? 1 : 0);
        Record* done_record = add_text_line(newline);
        if (done_record) batch->push_back(std::move(*done_record));
      }
    }
    return Status::ok();
  }

  int64_t bytes_read() const { return bytes_read_; }

 private:
  Status parse_json_line(Record* record) {
    record->line = line_no_;
    const std::string where =
        "--input '" + options_.input + "' line " + std::to_string(line_no_) + ": ";
    auto parsed = parse_json(line_, "");
    if (!parsed) {
      return Status::bad_input(where + parsed.status().message() +
                           " -- fix the line (each line must be one JSON object), or pass "
                           "--input-format text for plain text");
    }
    const nlohmann::json& doc = parsed.value();
    if (!doc.is_object()) {
      return Status::bad_input(
          where + "a JSON " + std::string(doc.type_name()) +
          ", not an object -- each line must be one JSON object like {\"text\": \"...\"}");
    }
    record->texts.reserve(options_.json_keys.size());
    for (const std::string& key : options_.json_keys) {
      auto it = doc.find(key);
      if (it == doc.end()) {
        std::string keys;
        for (const auto& [k, v] : doc.items()) keys += (keys.empty() ? "" : ", ") + k;
        return Status::bad_input(
            where + "has no key '" + key + "' (its keys: " + (keys.empty() ? "none" : keys) +
            ") -- pass the key that holds the text with --json-keys, or fix the line");
      }
      if (!it->is_string()) {
        return Status::bad_input(where + "key '" + key + "' is a JSON " + std::string(it->type_name()) +
                             ", not a string -- store each document as a string");
      }
      record->texts.push_back(it->get<std::string>());
    }
    return Status::ok();
  }

  // Adds a text-mode line; returns the finished record when this line ends a document.
  Record* add_text_line(bool newline) {
    bool separator;
    if (options_.text_separator.empty()) {
      separator = is_blank(line_);
    } else {
      std::string_view l(line_);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      separator = l == options_.text_separator;
    }
    if (separator) {
      if (pending_.texts.empty()) {
        pending_.bytes = 0;  // several separators in a row
        return nullptr;
      }
      finished_ = std::move(pending_);
      pending_ = Record{};
      return &finished_;
    }
    if (pending_.texts.empty()) {
      pending_.line = line_no_;
      pending_.texts.emplace_back();
    }
    pending_.texts[0] += line_;
    if (newline) pending_.texts[0] += '\n';
    return nullptr;
  }

  const PreprocessOptions& options_;
  bool jsonl_;
  std::vector<char> buffer_ = std::vector<char>(1 << 20);
  std::ifstream in_;
  std::string line_;
  int64_t line_no_ = 0;
  int64_t bytes_read_ = 0;
  Record pending_;  // text mode: the document being assembled
  Record finished_;
};

Result<bool> detect_jsonl(const PreprocessOptions& options) {
  if (options.input_format == "jsonl") return true;
  if (options.input_format == "text") return false;
  std::ifstream in(options.input, std::ios::binary);
  if (!in) {
    return Status::error("--input '" + options.input + "' cannot be read (" + std::strerror(errno) +
                         ") -- check the path");
  }
  char c;
  bool start = true;
  while (in.get(c)) {
    // Skip a UTF-8 byte-order mark at the very start, and whitespace.
    if (start && static_cast<unsigned char>(c) == 0xEF) {
      char bom[2];
      if (in.read(bom, 2) && static_cast<unsigned char>(bom[0]) == 0xBB &&
          static_cast<unsigned char>(bom[1]) == 0xBF) {
        start = false;
        continue;
      }
      return false;
    }
    start = false;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') continue;
    return c == '{';
  }
  return false;
}

void print_progress(const PreprocessProgress& p) {
  double mb = double(p.bytes_read) / 1e6;
  fmt::print(stderr, "troupe preprocess: {} documents, {:.1f} MB ({:.0f}%), {:.1f} MB/s\n",
             p.documents, mb,
             p.input_bytes > 0 ? 100.0 * double(p.bytes_read) / double(p.input_bytes) : 100.0,
             p.seconds > 0 ? mb / p.seconds : 0.0);
}

// Everything but the tokenizer, which run_preprocess loads once itself.
Status validate_flags(const PreprocessOptions& o) {
  if (o.tokenizer_type == "NullTokenizer")
    return Status::bad_input(
        "--tokenizer-type NullTokenizer has no text to tokenise with (it is for --mock-data and "
        "plans) -- preprocess with the tokenizer the model trains with");
  if (o.input.empty())
    return Status::bad_input("--input is required -- pass the JSONL or text file to tokenise");
  std::error_code ec;
  if (!fs::is_regular_file(o.input, ec)) {
    return Status::bad_input("--input '" + o.input + "' is not a readable file -- check the path");
  }
  if (o.output_prefix.empty()) {
    return Status::bad_input(
        "--output-prefix is required -- pass e.g. data/corpus (writes "
        "data/corpus_text_document.*)");
  }
  fs::path dir = fs::path(o.output_prefix).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec)) {
    return Status::bad_input("--output-prefix '" + o.output_prefix + "': directory '" + dir.string() +
                         "' does not exist -- create it first");
  }
  if (o.input_format != "auto" && o.input_format != "jsonl" && o.input_format != "text") {
    return Status::bad_input("--input-format '" + o.input_format +
                         "' is not one of auto, jsonl, text -- pick one");
  }
  if (o.json_keys.empty())
    return Status::bad_input("--json-keys is empty -- pass at least one key, e.g. text");
  for (size_t i = 0; i < o.json_keys.size(); ++i) {
    if (o.json_keys[i].empty())
      return Status::bad_input("--json-keys has an empty key -- pass key names");
    if (std::find(o.json_keys.begin(), o.json_keys.begin() + i, o.json_keys[i]) !=
        o.json_keys.begin() + i) {
      return Status::bad_input("--json-keys names '" + o.json_keys[i] +
                           "' twice -- pass each key once");
    }
  }
  if (o.workers < 1) return Status::bad_input("--workers must be at least 1 -- pass e.g. --workers 4");
  if (o.partitions < 1)
    return Status::bad_input("--partitions must be at least 1 -- pass e.g. --partitions 1 (the output is the same "
                             "for any number)");
  if (o.log_interval < 0)
    return Status::bad_input("--log-interval must be at least 1 -- pass e.g. --log-interval 1000");
  if (o.text_separator.find('\n') != std::string::npos) {
    return Status::bad_input(
        "--text-separator must be one line -- pass the separator line's text, e.g. %");
  }
  return Status::ok();
}

}  // namespace

std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key, bool split_sentences) {
  return output_prefix + "_" + key + (split_sentences ? "_sentence" : "_document");
}

namespace {

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_closing(char c) { return c == '"' || c == '\'' || c == ')' || c == ']' || c == '}'; }

// Whether the word ending at text[end - 1] == '.' is an initial or a common abbreviation.
bool abbreviation_before(const std::string& text, size_t end) {
  size_t begin = end - 1;  // the '.'
  while (begin > 0 && !is_space(static_cast<unsigned char>(text[begin - 1])) && text[begin - 1] != '(' &&
         text[begin - 1] != '"')
    --begin;
  std::string word = text.substr(begin, end - 1 - begin);  // without the final '.'
  if (word.size() == 1 && std::isalpha(static_cast<unsigned char>(word[0]))) return true;  // "J. Smith"
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const char* const kAbbreviations[] = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc",
                                               "e.g", "i.e", "inc", "ltd", "co", "no", "fig", "cf", "al", "approx"};
  for (const char* a : kAbbreviations)
    if (word == a) return true;
  return false;
}

}  // namespace

std::vector<std::string> split_sentences(const std::string& text, bool keep_newlines) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  const size_t n = text.size();
  while (i < n) {
    const char c = text[i];
    if (c != '.' && c != '!' && c != '?') {
      ++i;
      continue;
    }
    size_t end = i;  // one past the punctuation run and its closing quotes / brackets
    while (end < n && (text[end] == '.' || text[end] == '!' || text[end] == '?')) ++end;
    const bool single_period = end == i + 1 && c == '.';
    while (end < n && is_closing(text[end])) ++end;
    size_t next = end;
    while (next < n && is_space(static_cast<unsigned char>(text[next]))) ++next;
    const bool boundary = next > end && next < n && !std::islower(static_cast<unsigned char>(text[next])) &&
                          !(single_period && abbreviation_before(text, i + 1));
    if (!boundary) {
      i = end;
      continue;
    }
    out.push_back(text.substr(start, (keep_newlines ? next : end) - start));
    start = next;
    i = next;
  }
  if (start < n) out.push_back(text.substr(start));
  return out;
}

Status validate_preprocess_options(const PreprocessOptions& o) {
  TROUPE_RETURN_IF_ERROR(validate_flags(o));
  auto tok = make_tokenizer(o.tokenizer_type, o.vocab_file, o.merge_file, o.tokenizer_model);
  return tok.is_ok() ? Status::ok() : tok.status();
}

Result<PreprocessSummary> run_preprocess(const PreprocessOptions& options,
                                         const PreprocessProgressFn& progress) {
  TROUPE_RETURN_IF_ERROR(validate_flags(options));
  auto tokenizer_or =
      make_tokenizer(options.tokenizer_type, options.vocab_file, options.merge_file, options.tokenizer_model);
  if (!tokenizer_or) return tokenizer_or.status();
  const Tokenizer& tokenizer = **tokenizer_or;
  auto jsonl = detect_jsonl(options);
  if (!jsonl) return jsonl.status();

  const auto start = Clock::now();
  PreprocessSummary summary;
  summary.format = *jsonl ? "jsonl" : "text";
  std::error_code ec;
  summary.input_bytes = static_cast<int64_t>(fs::file_size(options.input, ec));
  const std::vector<std::string> keys =
      *jsonl ? options.json_keys : std::vector<std::string>{"text"};
  const IndexDType dtype = token_dtype_for_vocab(tokenizer.vocab_size());

  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : keys) {
    PreprocessOutput out;
    out.key = key;
    out.prefix = preprocess_output_prefix(options.output_prefix, key, options.split_sentences);
    out.dtype = dtype;
    auto b = IndexedDatasetBuilder::create(out.prefix, dtype);
    if (!b) return b.status();
    builders.push_back(std::move(*b));
    summary.outputs.push_back(out);
  }

  RecordReader reader(options, *jsonl);
  TROUPE_RETURN_IF_ERROR(reader.open());
  ThreadPool pool(options.workers);
  std::vector<Record> batch;
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // (records in batch * keys) sentences, non-empty
  int64_t record_bytes = 0;
  auto last_report = start;
  PreprocessProgress report;
  report.input_bytes = summary.input_bytes;
  bool done = false;
  while (!done) {
    TROUPE_RETURN_IF_ERROR(reader.next_batch(&batch, &done));
    const size_t nk = keys.size();
    tokens.assign(batch.size() * nk, {});
    pool.parallel_for(
        static_cast<int64_t>(batch.size()),
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            for (size_t k = 0; k < nk; ++k) {
              // Megatron's Encoder.encode: sentences with no tokens are dropped; EOD ends the last.
              auto& sentences = tokens[r * nk + k];
              if (options.split_sentences) {
                for (const std::string& sentence : split_sentences(batch[r].texts[k], options.keep_newlines)) {
                  std::vector<int32_t> ids = tokenizer.encode(sentence);
                  if (!ids.empty()) sentences.push_back(std::move(ids));
                }
              } else {
                std::vector<int32_t> ids = tokenizer.encode(batch[r].texts[k]);
                if (!ids.empty()) sentences.push_back(std::move(ids));
              }
              if (options.append_eod && !sentences.empty()) sentences.back().push_back(tokenizer.eod());
            }
          }
        },
        /*grain=*/16);
    for (size_t r = 0; r < batch.size(); ++r) {
      for (size_t k = 0; k < nk; ++k) {
        // IndexedDatasetBuilder.add_document: a document without tokens is still a document.
        for (const std::vector<int32_t>& t : tokens[r * nk + k]) {
          TROUPE_RETURN_IF_ERROR(builders[k]->add_item(t));
          summary.outputs[k].sequences += 1;
          summary.outputs[k].tokens += static_cast<int64_t>(t.size());
        }
        builders[k]->end_document();
        summary.outputs[k].documents += 1;
      }
      summary.records += 1;
      record_bytes += batch[r].bytes;
      if (options.log_interval > 0 && summary.records % options.log_interval == 0) {
        report.documents = summary.records;
        report.bytes_read = record_bytes;
        report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        progress ? progress(report) : print_progress(report);
      }
    }

    auto now = Clock::now();
    if (options.log_interval == 0 && now - last_report >= std::chrono::seconds(2) && !done) {
      last_report = now;
      report.documents = summary.records;
      report.bytes_read = reader.bytes_read();
      report.seconds = std::chrono::duration<double>(now - start).count();
      progress ? progress(report) : print_progress(report);
    }
  }

  int64_t total_tokens = 0;
  for (const auto& out : summary.outputs) total_tokens += out.tokens;
  if (total_tokens == 0) {
    return Status::bad_input("--input '" + options.input + "' holds no tokens (" + std::to_string(summary.records) +
                             " records, every document empty; " + summary.format +
                             " format) -- check the file, --input-format and --json-keys");
  }
  // All datasets complete under temporary names before any is renamed into place.
  for (auto& b : builders) TROUPE_RETURN_IF_ERROR(b->finish());
  for (auto& b : builders) TROUPE_RETURN_IF_ERROR(b->commit());
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace troupe
