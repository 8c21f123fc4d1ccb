// Status and Result<T>: how every fallible call in pscore reports failure.
// No exceptions cross our code (libuv calls us from C frames); docs/design.md, Layers (errors).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include <glog/logging.h>

namespace pscore {

enum class Code : int32_t {
  kOk = 0,
  kInvalidArgument = 1,
  kProtocol = 2,
  kUnavailable = 3,
  kTimeout = 4,
  kResourceExhausted = 5,
  kInternal = 6,
  kNotFound = 7,
  kAlreadyExists = 8,
  kCancelled = 9,
  kFailedPrecondition = 10,
  kPermissionDenied = 11,
  kAborted = 12,
  kUnimplemented = 13,
};

// Stable lower-case name of a code ("ok", "timeout", ...), used in logs and on the wire.
const char* CodeName(Code code);
// Maps a wire integer back to a Code; unknown values become kInternal.
Code CodeFromInt(int32_t value);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "timeout: barrier b1: 2/3 arrived" (or "ok").
  std::string ToString() const;
  void IgnoreError() const {}

  bool operator==(const Status& o) const { return code_ == o.code_ && message_ == o.message_; }
  bool operator!=(const Status& o) const { return !(*this == o); }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

// Result<T>: a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design.
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design.
    CHECK(!status_.ok()) << "Result built from an OK status without a value";
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& {
    CHECK(ok()) << status_;
    return *value_;
  }
  T& value() & {
    CHECK(ok()) << status_;
    return *value_;
  }
  T&& value() && {
    CHECK(ok()) << status_;
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

#define PSCORE_RETURN_IF_ERROR(expr)      \
  do {                                    \
    ::pscore::Status _st = (expr);        \
    if (!_st.ok()) return _st;            \
  } while (0)

}  // namespace pscore
