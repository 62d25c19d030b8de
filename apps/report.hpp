// How the CLI prints: error lines, the live progress line, and JSON lines for --metrics-file.
#pragma once
#include <cstdio>
#include <string>

#include "engine/types.hpp"
#include "troupe/status.hpp"

namespace troupe::apps {

// "troupe <command>: error: <message>" on stderr.
void print_error(const std::string& command, const std::string& message);
inline void print_error(const std::string& command, const Status& st) { print_error(command, st.message()); }

// Megatron-style iteration line.
std::string format_iteration(const IterationStats& s);
std::string iteration_json(const IterationStats& s);
std::string eval_json(const EvalStats& e);

// Prints progress: on a terminal a status line rewritten every iteration plus a permanent line every
// log_interval iterations; elsewhere (logs, CI) only the permanent lines.
class ProgressPrinter {
 public:
  // enabled false: prints nothing (the ranks other than 0 of a multi-process job).
  explicit ProgressPrinter(int64_t log_interval, bool enabled = true);
  void iteration(const IterationStats& s);
  void line(const std::string& text);  // a permanent line (clears the status line first)
  void set_log_interval(int64_t n) { log_interval_ = n > 0 ? n : 1; }

 private:
  int64_t log_interval_;
  bool tty_;
  bool enabled_;
  bool status_shown_ = false;
};

}  // namespace troupe::apps
