// Fast-path counters; see fast_path_registry.h.
#include "kernels/base/fast_path_registry.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>

namespace flux2 {

struct FastPath::Entry {
  std::string name;
  std::atomic<int64_t> invocations{0};
  std::atomic<bool> disabled{false};
  std::map<std::string, int64_t> fallbacks;  // guarded by the registry mutex
};

namespace {

using Entry = FastPath::Entry;

struct Registry {
  std::mutex mutex;
  std::deque<Entry> entries;  // deque: stable addresses
};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::atomic<bool> global_enabled{true};

}  // namespace

FastPath::FastPath(absl::string_view name) : name_(name) {
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
  entry_ = &r.entries.back();
}

bool FastPath::enabled() const {
  return global_enabled.load(std::memory_order_relaxed) &&
         !entry_->disabled.load(std::memory_order_relaxed);
}

void FastPath::count_invocation() {
  entry_->invocations.fetch_add(1, std::memory_order_relaxed);
}

void FastPath::count_fallback(absl::string_view reason) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  entry_->fallbacks[std::string(reason)]++;
}

void FastPath::disable(absl::string_view error) {
  if (!entry_->disabled.exchange(true)) {
    std::fprintf(stderr, "flux2: fast path %s disabled for this process after an error: %s\n",
                 name_.c_str(), std::string(error).c_str());
  }
  count_fallback("runtime_error");
}

std::vector<FastPathCounters> fast_path_snapshot() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<FastPathCounters> out;
  for (const Entry& entry : r.entries) {
    out.push_back(FastPathCounters{entry.name, entry.invocations.load(), entry.fallbacks,
                                   entry.disabled.load()});
  }
  std::sort(out.begin(), out.end(),
            [](const FastPathCounters& a, const FastPathCounters& b) { return a.path < b.path; });
  return out;
}

void set_fast_paths_enabled(bool enabled) {
  global_enabled.store(enabled);
}
bool fast_paths_enabled() {
  return global_enabled.load();
}

}  // namespace flux2
