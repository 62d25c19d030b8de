// Recoverable errors as values. A Status is ok or carries a message written for the user: what is
// wrong and how to fix it. Result<T> holds a value or a failed Status. Neither throws.
#pragma once
#include <optional>
#include <string>
#include <utility>

#include "kernels/check.hpp"

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
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("reading foo.idx: ") to a failed status; ok stays ok.
  Status with_context(const std::string& context) const {
    return failed_ ? error(context + message_) : *this;
  }

 private:
  std::string message_;
  bool failed_ = false;
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
