// The device LRU of uploaded LoRA adapters; see lora_device_cache.h.
// Tested by tests/host/lora_apply_test.cc.
#include "model/lora_device_cache.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {

bool LoraDeviceCache::make_room(int64_t needed, const std::vector<std::string>& keep) {
  while (stats_.bytes + needed > capacity_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.pinned || std::count(keep.begin(), keep.end(), it->first) > 0) continue;
      if (victim == entries_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == entries_.end()) return false;
    stats_.bytes -= victim->second.weights->device_bytes();
    ++stats_.evictions;
    entries_.erase(victim);
  }
  return true;
}

absl::StatusOr<std::vector<Flux2LoraUse>> LoraDeviceCache::acquire(
    Backend& backend, const Flux2Config& config, std::span<const LoraRequest> requests) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> keys;
  int64_t missing_bytes = 0, total_bytes = 0;
  const int64_t value_bytes = dtype_size(backend.weight_dtype());
  for (const LoraRequest& r : requests) {
    keys.push_back(r.key);
    const int64_t bytes = Flux2LoraWeights::device_bytes(*r.adapter, value_bytes);
    total_bytes += bytes;
    if (entries_.count(r.key) == 0) missing_bytes += bytes;
  }
  // Without a budget (the CLI, the golden checks) adapters are uploaded for each request only.
  const bool cached = capacity_ > 0;
  if (cached && !make_room(missing_bytes, keys)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("loras: ", total_bytes, " bytes of adapters do not fit --lora-cache-bytes ",
                     capacity_, total_bytes <= capacity_ ? " beside the pinned adapters" : ""));
  }
  std::vector<Flux2LoraUse> uses;
  for (const LoraRequest& r : requests) {
    auto found = entries_.find(r.key);
    if (found != entries_.end()) {
      ++stats_.hits;
      found->second.last_use = ++clock_;
      uses.push_back({found->second.weights, r.weight});
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    FLUX_ASSIGN_OR_RETURN(std::shared_ptr<const Flux2LoraWeights> weights,
                          Flux2LoraWeights::upload(backend, config, r.adapter, r.image.get()));
    stats_.upload_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++stats_.misses;
    if (cached) {
      entries_[r.key] = {weights, ++clock_, false};
      stats_.bytes += weights->device_bytes();
    }
    uses.push_back({std::move(weights), r.weight});
  }
  stats_.adapters = static_cast<int64_t>(entries_.size());
  return uses;
}

absl::Status LoraDeviceCache::pin(Backend& backend, const Flux2Config& config,
                                  const LoraRequest& request) {
  FLUX_RETURN_IF_ERROR(acquire(backend, config, std::span(&request, 1)).status());
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = entries_.find(request.key);
  if (found == entries_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--lora-preload: ", request.key, " does not fit --lora-cache-bytes ", capacity_));
  }
  found->second.pinned = true;
  return absl::OkStatus();
}

bool LoraDeviceCache::resident(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.count(key) > 0;
}

LoraCacheStats LoraDeviceCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  LoraCacheStats stats = stats_;
  stats.capacity = capacity_;
  return stats;
}

}  // namespace flux2
