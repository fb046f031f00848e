// The LoRA families of flux2_server's metrics (server/ops/METRICS.md): requests by adapter count,
// the host and device adapter caches, load and upload times, load failures by reason. No adapter
// names as labels. Tested by tests/server/metrics_test.cc and tests/server/lora_e2e_test.cc.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace flux2::server {

class LoraMetrics {
 public:
  explicit LoraMetrics(prometheus::Registry& registry);

  // A validated request with `adapters` adapters (label 0, 1, 2 or 3+).
  void count_request(int64_t adapters);
  // An adapter looked up in `tier` ("host" or "device").
  void count_cache(absl::string_view tier, bool hit, int64_t count = 1);
  void set_cache(absl::string_view tier, int64_t bytes, int64_t capacity);
  void count_evictions(absl::string_view tier, int64_t count);
  void observe_load(double seconds);    // read + hash + parse of one adapter file
  void observe_upload(double seconds);  // device uploads of one request
  // `reason`: not_found, format, unknown_key, shape, rank, unsupported, io.
  void count_load_failure(absl::string_view reason);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& cache_requests_;
  prometheus::Family<prometheus::Gauge>& cache_bytes_;
  prometheus::Family<prometheus::Gauge>& cache_capacity_;
  prometheus::Family<prometheus::Counter>& evictions_;
  prometheus::Histogram& load_;
  prometheus::Histogram& upload_;
  prometheus::Family<prometheus::Counter>& failures_;
};

}  // namespace flux2::server
