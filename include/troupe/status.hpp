// Recoverable errors as values. A Status is ok or carries a message written for the user: what is
// wrong and how to fix it. Result<T> holds a value or a failed Status. Neither throws.
//
// A failed Status has a kind, which decides the exit code the CLI ends with (README, "Exit codes"):
// bad input (a flag, config, dataset or checkpoint that cannot be used, a checkpoint of another
// model or run: the user must change something; exit 2) or a failure at run time (I/O, a peer, a
// diverged run; exit 1). Status::error is run time; Status::bad_input marks input the caller refused.
#pragma once
#include <optional>
#include <string>
#include <utility>

#include "troupe/check.hpp"

namespace troupe {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return {}; }
  static Status error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.failed_ = true;
    return s;
  }
  static Status bad_input(std::string message) {
    Status s = error(std::move(message));
    s.bad_input_ = true;
    return s;
  }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  // A failure caused by input the user must change (exit code 2), not by the run itself.
  bool is_bad_input() const { return failed_ && bad_input_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("reading foo.idx: ") to a failed status, keeping its kind; ok stays ok.
  Status with_context(const std::string& context) const {
    if (!failed_) return *this;
    Status s = *this;
    s.message_ = context + message_;
    return s;
  }
  // The same failure marked as bad input (a reader's error seen by a command that read user input).
  Status as_bad_input() const {
    Status s = *this;
    s.bad_input_ = failed_;
    return s;
  }

 private:
  std::string message_;
  bool failed_ = false;
  bool bad_input_ = false;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}              // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {         // NOLINT: implicit by design
    TROUPE_CHECK(!status_.is_ok(), "a Result built from a Status must carry an error");
  }
  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    TROUPE_CHECK(is_ok(), status_.message());
    return *value_;
  }
  T&& value() && {
    TROUPE_CHECK(is_ok(), status_.message());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace troupe

// Returns early from a function returning Status (or Result) when `expr` failed.
#define TROUPE_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::troupe::Status _troupe_st = (expr);     \
    if (!_troupe_st.is_ok()) return _troupe_st; \
  } while (0)
