// Result<T>: a value or a non-ok Status (std::expected in spirit; swap when on C++23).
#pragma once

#include <cstdlib>
#include <optional>
#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace kvo {

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    KVO_CHECK(!status_.ok());
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    KVO_CHECK(ok());
    return *value_;
  }
  const T& value() const& {
    KVO_CHECK(ok());
    return *value_;
  }
  T&& value() && {
    KVO_CHECK(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kvo

#define KVO_CONCAT_INNER_(a, b) a##b
#define KVO_CONCAT_(a, b) KVO_CONCAT_INNER_(a, b)
// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` is a declaration (auto x), never an expression.
#define KVO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
// KVO_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status from the enclosing function on error.
#define KVO_ASSIGN_OR_RETURN(lhs, expr) \
  KVO_ASSIGN_OR_RETURN_IMPL_(KVO_CONCAT_(kvo_result_, __LINE__), lhs, expr)
