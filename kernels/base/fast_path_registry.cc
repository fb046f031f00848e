// Fast-path counters and the admission rule; see fast_path_registry.h.
#include "kernels/base/fast_path_registry.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>

namespace flux2 {

struct FastPath::Entry {
  std::string name;
  FastPathKind kind = FastPathKind::kFused;
  std::atomic<int64_t> invocations{0};
  std::atomic<bool> disabled{false};
  std::map<std::string, int64_t> fallbacks;  // guarded by the registry mutex
};

namespace {

using Entry = FastPath::Entry;

struct Registry {
  std::mutex mutex;
  std::deque<Entry> entries;              // deque: stable addresses
  std::set<std::string> injected;         // paths whose next run fails (test hook)
  std::atomic<bool> any_injected{false};  // lets the hot path skip the lock
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

FastPath::FastPath(const FastPathSpec& spec) : spec_(spec), name_(spec.name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (Entry& entry : r.entries) {
    if (entry.name == name_) {
      entry_ = &entry;
      return;
    }
  }
  r.entries.emplace_back();
  r.entries.back().name = name_;
  r.entries.back().kind = spec.kind;
  entry_ = &r.entries.back();
}

bool FastPath::admit(const RequestOptions& request, absl::string_view unsupported) {
  absl::string_view reason;
  if (spec_.kind == FastPathKind::kFused && !request.fast_paths) {
    reason = kSwitchedOff;
  } else if (entry_->disabled.load(std::memory_order_relaxed)) {
    reason = kDisabledAfterError;
  } else {
    reason = unsupported;
  }
  if (reason.empty()) return true;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  entry_->fallbacks[std::string(reason)]++;
  return false;
}

void FastPath::count_invocation() {
  entry_->invocations.fetch_add(1, std::memory_order_relaxed);
}

bool FastPath::disabled() const {
  return entry_->disabled.load(std::memory_order_relaxed);
}

void FastPath::disable(absl::string_view error) {
  if (!entry_->disabled.exchange(true)) {
    std::fprintf(stderr, "flux2: fast path %s disabled for this process after an error: %s\n",
                 name_.c_str(), std::string(error).c_str());
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  entry_->fallbacks[std::string(kRuntimeError)]++;
}

bool FastPath::take_injected_failure() {
  Registry& r = registry();
  if (!r.any_injected.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(r.mutex);
  const bool injected = r.injected.erase(name_) > 0;
  r.any_injected = !r.injected.empty();
  return injected;
}

void inject_fast_path_failure(absl::string_view path) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.injected.insert(std::string(path));
  r.any_injected = true;
}

std::vector<FastPathCounters> fast_path_snapshot() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<FastPathCounters> out;
  for (const Entry& entry : r.entries) {
    out.push_back(FastPathCounters{entry.name, entry.kind, entry.invocations.load(),
                                   entry.fallbacks, entry.disabled.load()});
  }
  std::sort(out.begin(), out.end(),
            [](const FastPathCounters& a, const FastPathCounters& b) { return a.path < b.path; });
  return out;
}

}  // namespace flux2
