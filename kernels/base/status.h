// Error handling for the whole project, in three tiers: FLUX_CHECK aborts on programmer errors
// and impossible states; recoverable errors (bad request, bad file, out of memory) return
// absl::Status / StatusOr, no exceptions cross a module boundary, and only server/ maps them to
// grpc::Status; op launchers return InvalidArgument instead of launching (op_checks.h).
// Tested indirectly by every test that expects an error.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Aborts with the expression, file and line: for impossible states and broken invariants.
#define FLUX_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FLUX_CHECK failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

// Returns the status from the enclosing function when `expr` is not OK.
#define FLUX_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status flux_status_ = (expr);        \
    if (!flux_status_.ok()) return flux_status_; \
  } while (0)

#define FLUX_CONCAT_INNER_(a, b) a##b
#define FLUX_CONCAT_(a, b) FLUX_CONCAT_INNER_(a, b)

// `FLUX_ASSIGN_OR_RETURN(auto x, f())` declares `x` from a StatusOr or returns its error.
// It expands to several statements: put it in braces under an `if`.
#define FLUX_ASSIGN_OR_RETURN(lhs, expr) \
  FLUX_ASSIGN_OR_RETURN_IMPL_(FLUX_CONCAT_(flux_statusor_, __LINE__), lhs, expr)
#define FLUX_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
