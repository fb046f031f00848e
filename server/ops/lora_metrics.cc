// The LoRA metric families; see lora_metrics.h. Tested by tests/server/metrics_test.cc.
#include "server/ops/lora_metrics.h"

#include <string>

namespace flux2::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Loads take ms (tiny adapters) to seconds (400 MB files); uploads ms to a second.
const prometheus::Histogram::BucketBoundaries& lora_buckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *buckets;
}

}  // namespace

LoraMetrics::LoraMetrics(prometheus::Registry& registry)
    : requests_(BuildCounter()
                    .Name("flux2_lora_requests_total")
                    .Help("Validated generation requests by how many LoRA adapters they apply")
                    .Register(registry)),
      cache_requests_(BuildCounter()
                          .Name("flux2_lora_cache_requests_total")
                          .Help("LoRA adapter lookups by cache tier and result")
                          .Register(registry)),
      cache_bytes_(BuildGauge()
                       .Name("flux2_lora_cache_bytes")
                       .Help("Bytes of LoRA adapters held by each cache tier")
                       .Register(registry)),
      cache_capacity_(BuildGauge()
                          .Name("flux2_lora_cache_capacity_bytes")
                          .Help("Budget of each LoRA cache tier")
                          .Register(registry)),
      evictions_(BuildCounter()
                     .Name("flux2_lora_cache_evictions_total")
                     .Help("LoRA adapters evicted from each cache tier")
                     .Register(registry)),
      load_(BuildHistogram()
                .Name("flux2_lora_load_duration_seconds")
                .Help("Reading, hashing and parsing one LoRA adapter file")
                .Register(registry)
                .Add({}, lora_buckets())),
      upload_(BuildHistogram()
                  .Name("flux2_lora_upload_duration_seconds")
                  .Help("Uploading a request's missing LoRA adapters to the device")
                  .Register(registry)
                  .Add({}, lora_buckets())),
      failures_(BuildCounter()
                    .Name("flux2_lora_load_failures_total")
                    .Help("LoRA adapters refused, by reason")
                    .Register(registry)) {
  for (const char* adapters : {"0", "1", "2", "3+"}) requests_.Add({{"adapters", adapters}});
  for (const char* tier : {"host", "device"}) {
    for (const char* result : {"hit", "miss"}) {
      cache_requests_.Add({{"tier", tier}, {"result", result}});
    }
    cache_bytes_.Add({{"tier", tier}});
    cache_capacity_.Add({{"tier", tier}});
    evictions_.Add({{"tier", tier}});
  }
  for (const char* reason :
       {"not_found", "format", "unknown_key", "shape", "rank", "unsupported", "io"}) {
    failures_.Add({{"reason", reason}});
  }
}

void LoraMetrics::count_request(int64_t adapters) {
  const std::string label = adapters >= 3 ? "3+" : std::to_string(adapters);
  requests_.Add({{"adapters", label}}).Increment();
}

void LoraMetrics::count_cache(absl::string_view tier, bool hit, int64_t count) {
  if (count <= 0) return;
  cache_requests_.Add({{"tier", std::string(tier)}, {"result", hit ? "hit" : "miss"}})
      .Increment(static_cast<double>(count));
}

void LoraMetrics::set_cache(absl::string_view tier, int64_t bytes, int64_t capacity) {
  cache_bytes_.Add({{"tier", std::string(tier)}}).Set(static_cast<double>(bytes));
  cache_capacity_.Add({{"tier", std::string(tier)}}).Set(static_cast<double>(capacity));
}

void LoraMetrics::count_evictions(absl::string_view tier, int64_t count) {
  if (count > 0)
    evictions_.Add({{"tier", std::string(tier)}}).Increment(static_cast<double>(count));
}

void LoraMetrics::observe_load(double seconds) {
  load_.Observe(seconds);
}

void LoraMetrics::observe_upload(double seconds) {
  upload_.Observe(seconds);
}

void LoraMetrics::count_load_failure(absl::string_view reason) {
  failures_.Add({{"reason", std::string(reason)}}).Increment();
}

}  // namespace flux2::server
