// Early-return macros for absl::Status and absl::StatusOr, so that a function reads as its
// happy path:
//
//   absl::StatusOr<Profile> Load(const std::string& path) {
//     KVTRIM_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
//     KVTRIM_RETURN_IF_ERROR(CheckHeader(bytes));
//     return Parse(bytes);
//   }
//
// Header-only and dependency-free (module `base`: every module may include it).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

/// Evaluates `expr` (an absl::Status) once; returns it from the enclosing function if it is
/// not OK.
#define KVTRIM_RETURN_IF_ERROR(expr)                                       \
  do {                                                                     \
    if (::absl::Status kvtrim_status_ = (expr); !kvtrim_status_.ok()) {    \
      return kvtrim_status_;                                               \
    }                                                                      \
  } while (false)

/// Evaluates `expr` (an absl::StatusOr<T>) once; returns its status from the enclosing
/// function if it is not OK, else moves its value into `lhs` (a declaration such as
/// `auto x` or `std::string x`, or an existing lvalue). One statement: not inside an
/// unbraced `if`.
#define KVTRIM_ASSIGN_OR_RETURN(lhs, expr) \
  KVTRIM_ASSIGN_OR_RETURN_IMPL_(KVTRIM_STATUS_CONCAT_(kvtrim_statusor_, __LINE__), lhs, expr)

// Implementation details of the macros above.
#define KVTRIM_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTRIM_STATUS_CONCAT_(a, b) KVTRIM_STATUS_CONCAT_INNER_(a, b)
#define KVTRIM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
