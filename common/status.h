// Status: the one error type of kvo (leveldb/abseil style). A code plus a message that names
// what was wrong. Cheap to return when ok. Thread-compatible value type.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace kvo {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kCorruption,
  kIOError,
  kOutOfSpace,
  kUnavailable,
  kFailedPrecondition,
  kOutOfRange,
  kCancelled,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status OutOfSpace(std::string m) { return {StatusCode::kOutOfSpace, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "InvalidArgument: endpoint 'ipc://x' ..."; "OK" when ok.
  std::string ToString() const;

  // Returns a copy with "context: " prepended to the message.
  Status WithContext(std::string_view context) const;

  // Marks an error as deliberately ignored; grep for IgnoreError to find them.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace kvo

#define KVO_RETURN_IF_ERROR(expr)                      \
  do {                                                 \
    ::kvo::Status kvo_status_tmp_ = (expr);            \
    if (!kvo_status_tmp_.ok()) return kvo_status_tmp_; \
  } while (0)
