// Early-return helpers for absl::Status / absl::StatusOr at module boundaries.
#ifndef TRAINCTL_COMMON_STATUS_MACROS_H_
#define TRAINCTL_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRAINCTL_CONCAT_INNER_(a, b) a##b
#define TRAINCTL_CONCAT_(a, b) TRAINCTL_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr) RETURN_IF_ERROR_IMPL_(TRAINCTL_CONCAT_(_status_, __COUNTER__), expr)
#define RETURN_IF_ERROR_IMPL_(tmp, expr) \
  do {                                   \
    ::absl::Status tmp = (expr);         \
    if (!tmp.ok()) return tmp;           \
  } while (0)

// `ASSIGN_OR_RETURN(T x, StatusOrExpr)`: declares/assigns the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TRAINCTL_CONCAT_(_status_or_, __COUNTER__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#endif  // TRAINCTL_COMMON_STATUS_MACROS_H_
