// The process-wide fast-path registry and the one rule every fast path follows (kernels/README.md,
// "The fast-path policy"). Each path is declared once by a FastPathSpec (its name, kind, quality
// and preconditions: the backend's policy table, kernels/cuda/cuda_fast_paths.cc); run_fast_path()
// decides per call whether it runs, counts its invocations and its fallbacks by reason, and
// disables it for the process after a runtime error (logged once). server/ exports the counters as
// flux2_fast_path_invocations_total{path} and flux2_fast_path_fallbacks_total{path,reason}.
// Tested by tests/host/tensor_test.cc (FastPathRegistryTest) and
// tests/cuda/fast_path_fallback_test.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/base/request_options.h"

namespace flux2 {

// What a fast path is decides which switch it honours.
enum class FastPathKind : uint8_t {
  // A fused kernel replacing a chain of eager kernels with the same result by contract:
  // RequestOptions::fast_paths = false runs the chain instead (counted "switched_off").
  kFused,
  // The op's implementation (a library such as cuDNN, or our own FP8 kernels at quality=high),
  // with a plain fallback for the calls it cannot serve. Used whatever the fast-path switch says.
  kImplementation,
};

// One row of a backend's policy table.
struct FastPathSpec {
  const char* name;  // the metric label, e.g. "gate_residual"
  FastPathKind kind;
  Quality quality;     // kLossless: serves both qualities; kHigh: consulted only at quality=high
  const char* serves;  // its preconditions in words; the code checks them before launch
};

// Fallback reasons the rule itself gives (paths add their own, e.g. "unsupported_shape").
inline constexpr absl::string_view kSwitchedOff = "switched_off";
inline constexpr absl::string_view kDisabledAfterError = "disabled_after_error";
inline constexpr absl::string_view kRuntimeError = "runtime_error";

struct FastPathCounters {
  std::string path;  // e.g. "gate_residual"
  FastPathKind kind = FastPathKind::kFused;
  int64_t invocations = 0;                   // times the fast path ran
  std::map<std::string, int64_t> fallbacks;  // reason -> times the fallback ran instead
  bool disabled = false;                     // disabled after a runtime error
};

// One fast path. Instances are created once from the policy table and live forever.
class FastPath {
 public:
  explicit FastPath(const FastPathSpec& spec);
  const std::string& name() const { return name_; }
  const FastPathSpec& spec() const { return spec_; }

  // Whether the path may serve a call of `request`: not when it is a fused kernel and the request
  // switched fast paths off, when it was disabled after an error, or when `unsupported` names a
  // failed precondition (empty: all hold). Counts the fallback with its reason when it may not.
  bool admit(const RequestOptions& request, absl::string_view unsupported);
  void count_invocation();
  // True once a runtime error disabled the path for the process.
  bool disabled() const;
  // Disables the path for the rest of the process; logs `error` to stderr once and counts a
  // fallback with reason "runtime_error".
  void disable(absl::string_view error);
  // True once (then false) after inject_fast_path_failure named this path.
  bool take_injected_failure();

  struct Entry;  // the registry's record; defined in the .cc

 private:
  FastPathSpec spec_;
  std::string name_;
  Entry* entry_;  // stable: owned by the registry for the life of the process
};

// The rule, one entry point for every fast path: runs `fast` when path.admit() lets it, else
// `fallback`. A `fast` that fails disables the path and runs `fallback`, unless `capturing()`
// (a CUDA graph capture: a fallback captured into the graph would hide the error), where the error
// propagates.
template <typename Fast, typename Fallback, typename Capturing>
absl::Status run_fast_path(FastPath& path, const RequestOptions& request,
                           absl::string_view unsupported, Fast&& fast, Fallback&& fallback,
                           Capturing&& capturing) {
  if (!path.admit(request, unsupported)) return fallback();
  absl::Status status = path.take_injected_failure()
                            ? absl::InternalError(absl::StrCat(path.name(), ": injected failure"))
                            : fast();
  if (status.ok()) {
    path.count_invocation();
    return status;
  }
  if (capturing()) return status;
  path.disable(status.message());
  return fallback();
}

// A snapshot of every registered fast path, sorted by name.
std::vector<FastPathCounters> fast_path_snapshot();

// Test hook: makes the next run of fast path `path` fail as a kernel error would, to exercise the
// disable-and-fall-back rule (tests/cuda/fast_path_fallback_test.cc).
void inject_fast_path_failure(absl::string_view path);

}  // namespace flux2
