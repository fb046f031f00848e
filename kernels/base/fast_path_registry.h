// The process-wide fast-path registry (design.md "Fallback semantics"): every fused fast path
// registers a FastPath, counts its invocations and its fallbacks by reason, and is disabled for
// the process after a runtime error (logged once). server/ exports the counters to Prometheus as
// flux2_fast_path_invocations_total{path} and flux2_fast_path_fallbacks_total{path,reason}.
// Tested by tests/host/tensor_test.cc (FastPathRegistryTest) and
// tests/cuda/fast_path_fallback_test.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flux2 {

struct FastPathCounters {
  std::string path;                          // e.g. "gate_residual"
  int64_t invocations = 0;                   // times the fused kernel ran
  std::map<std::string, int64_t> fallbacks;  // reason -> times the eager chain ran instead
  bool disabled = false;                     // disabled after a runtime error
};

// One fast path. Instances are created once (function-local statics) and live forever.
class FastPath {
 public:
  explicit FastPath(absl::string_view name);
  const std::string& name() const { return name_; }

  // False when disabled for the process or when fast paths are switched off globally.
  bool enabled() const;
  void count_invocation();
  void count_fallback(absl::string_view reason);
  // Disables the path for the rest of the process; logs `error` to stderr once and counts a
  // fallback with reason "runtime_error".
  void disable(absl::string_view error);

  struct Entry;  // the registry's record; defined in the .cc

 private:
  std::string name_;
  Entry* entry_;  // stable: owned by the registry for the life of the process
};

// A snapshot of every registered fast path, sorted by name.
std::vector<FastPathCounters> fast_path_snapshot();

// The process-wide switch behind `--fast-paths=off` (eager chains only when false).
void set_fast_paths_enabled(bool enabled);
bool fast_paths_enabled();

}  // namespace flux2
