// The LoRA adapters kept on the device between requests: uploaded adapters by content key in
// least-recently-used order under a byte budget. An adapter a request uses is never evicted for
// it, and pinned ones (--lora-preload) never at all. Used by one thread at a time (the engine's),
// its stats read from any. Tested by tests/host/lora_apply_test.cc.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/flux2_lora.h"

namespace flux2 {

// An adapter a request applies, parsed for the pipeline's transformer (parse_lora_adapter).
struct LoraRequest {
  std::string key;  // the adapter's identity in the device cache (its content hash)
  std::shared_ptr<const LoraAdapter> adapter;
  double weight = 1.0;  // set_adapters' weight: PEFT scaling = weight * alpha / r
  // Its packed values for this backend, made where it was loaded (the LoRA registry), if any: the
  // upload is then one copy.
  std::shared_ptr<const LoraHostImage> image{};
};

struct LoraCacheStats {
  int64_t hits = 0;             // adapters a request found resident
  int64_t misses = 0;           // adapters uploaded for a request
  int64_t evictions = 0;        // adapters dropped to make room
  int64_t bytes = 0;            // resident now
  int64_t capacity = 0;         // the budget
  int64_t adapters = 0;         // resident now
  double upload_seconds = 0.0;  // every upload so far
};

class LoraDeviceCache {
 public:
  // capacity_bytes 0: nothing stays resident; each request uploads its adapters for itself.
  explicit LoraDeviceCache(int64_t capacity_bytes = 0) : capacity_(capacity_bytes) {}
  void set_capacity(int64_t capacity_bytes) { capacity_ = capacity_bytes; }

  // The device weights of `requests`, in order: resident ones as they are, the others uploaded
  // after evicting least-recently-used adapters outside `requests` (and not pinned) until they
  // fit. ResourceExhausted naming both sizes when the request's adapters alone exceed the budget.
  absl::StatusOr<std::vector<Flux2LoraUse>> acquire(Backend& backend, const Flux2Config& config,
                                                    std::span<const LoraRequest> requests);
  // Uploads `request`'s adapter (if not resident) and keeps it resident for good.
  absl::Status pin(Backend& backend, const Flux2Config& config, const LoraRequest& request);
  bool resident(const std::string& key) const;

  LoraCacheStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const Flux2LoraWeights> weights;
    uint64_t last_use = 0;
    bool pinned = false;
  };
  // Evicts unpinned entries not in `keep`, oldest first, until `needed` more bytes fit; false
  // when they cannot.
  bool make_room(int64_t needed, const std::vector<std::string>& keep);

  mutable std::mutex mutex_;  // guards everything below (stats() may run on another thread)
  int64_t capacity_ = 0;
  std::map<std::string, Entry> entries_;
  uint64_t clock_ = 0;
  LoraCacheStats stats_;
};

}  // namespace flux2
