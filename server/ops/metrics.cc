// flux2_server's Prometheus metrics; see metrics.h and server/ops/METRICS.md.
// Tested by tests/server/metrics_test.cc and the end-to-end test.
#include "server/ops/metrics.h"

#include <map>
#include <string>

#include "kernels/base/fast_path_registry.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace flux2::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// METRICS.md: requests and stages span tens of ms (tiny model, CPU) to minutes (FLUX.2-dev at
// 4 MP, 50 steps); steps span ms (small images on a GPU) to seconds.
const prometheus::Histogram::BucketBoundaries& request_buckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300};
  return *buckets;
}
const prometheus::Histogram::BucketBoundaries& step_buckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *buckets;
}

// One rank's collectives in one step: tens of microseconds (tiny shapes, NVLink) to seconds
// (FLUX.2-dev at 4 MP, or CPU ranks).
const prometheus::Histogram::BucketBoundaries& collective_buckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  return *buckets;
}

// Step caching's relative L1 distances: around sglang's threshold 0.24 (DBCache caches below it).
const prometheus::Histogram::BucketBoundaries& diff_buckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.02, 0.05, 0.08, 0.12, 0.16, 0.2, 0.24, 0.3, 0.4, 0.6, 1};
  return *buckets;
}

// Fast-path counters live in the process-wide registry (kernels/base/fast_path_registry.h); this
// collector reads a snapshot at every scrape, so the exported values are always current.
class FastPathCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily invocations{"flux2_fast_path_invocations_total",
                                         "Fused fast-path kernel runs",
                                         prometheus::MetricType::Counter,
                                         {}};
    prometheus::MetricFamily fallbacks{"flux2_fast_path_fallbacks_total",
                                       "Eager-chain runs instead of the fast path, by reason",
                                       prometheus::MetricType::Counter,
                                       {}};
    for (const FastPathCounters& path : fast_path_snapshot()) {
      prometheus::ClientMetric metric;
      metric.label = {{"path", path.path}};
      metric.counter.value = static_cast<double>(path.invocations);
      invocations.metric.push_back(metric);
      for (const auto& [reason, count] : path.fallbacks) {
        prometheus::ClientMetric fallback;
        fallback.label = {{"path", path.path}, {"reason", reason}};
        fallback.counter.value = static_cast<double>(count);
        fallbacks.metric.push_back(fallback);
      }
    }
    return {invocations, fallbacks};
  }
};

}  // namespace

absl::string_view stage_name(Stage stage) {
  switch (stage) {
    case Stage::kTokenize:
      return "tokenize";
    case Stage::kTextEncode:
      return "text_encode";
    case Stage::kReferenceEncode:
      return "reference_encode";
    case Stage::kDenoise:
      return "denoise";
    case Stage::kDecode:
      return "decode";
    case Stage::kEncode:
      return "encode";
  }
  return "unknown";
}

absl::string_view quality_name(Quality quality) {
  return quality == Quality::kHigh ? "high" : "lossless";
}

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      fast_paths_(std::make_shared<FastPathCollector>()),
      system_(std::make_shared<SystemMetrics>()),
      requests_(BuildCounter()
                    .Name("flux2_requests_total")
                    .Help("Finished RPCs by method and gRPC code")
                    .Register(*registry_)),
      request_duration_(BuildHistogram()
                            .Name("flux2_request_duration_seconds")
                            .Help("RPC wall time, arrival to reply")
                            .Register(*registry_)),
      queue_duration_(BuildHistogram()
                          .Name("flux2_queue_duration_seconds")
                          .Help("Time a request waited in the admission queue")
                          .Register(*registry_)
                          .Add({}, request_buckets())),
      first_step_(BuildHistogram()
                      .Name("flux2_time_to_first_step_seconds")
                      .Help("Arrival to the end of a request's first denoising step")
                      .Register(*registry_)
                      .Add({}, request_buckets())),
      resource_exhausted_(BuildCounter()
                              .Name("flux2_resource_exhausted_total")
                              .Help("Requests refused or failed with RESOURCE_EXHAUSTED, by reason")
                              .Register(*registry_)),
      engine_faults_(BuildCounter()
                         .Name("flux2_engine_faults_total")
                         .Help("Device faults met by requests (device_memory, device_error) and "
                               "stalled engine stages (stall), by kind")
                         .Register(*registry_)),
      engine_stalled_(BuildGauge()
                          .Name("flux2_engine_stalled")
                          .Help("1 while a stage of the running request is far past its expected "
                                "time (liveness is NOT_SERVING meanwhile)")
                          .Register(*registry_)
                          .Add({})),
      stage_duration_(BuildHistogram()
                          .Name("flux2_stage_duration_seconds")
                          .Help("Per-request stage time")
                          .Register(*registry_)),
      step_duration_(BuildHistogram()
                         .Name("flux2_denoise_step_duration_seconds")
                         .Help("One denoising step (transformer forward(s) + Euler update)")
                         .Register(*registry_)),
      step_collectives_(BuildHistogram()
                            .Name("flux2_denoise_step_collective_seconds")
                            .Help("One GPU's collectives (all-to-all, all-gather) in one "
                                  "denoising step of a request split over several GPUs")
                            .Register(*registry_)),
      queue_depth_(BuildGauge()
                       .Name("flux2_queue_depth")
                       .Help("Requests waiting in the admission queue")
                       .Register(*registry_)
                       .Add({})),
      in_flight_(BuildGauge()
                     .Name("flux2_requests_in_flight")
                     .Help("Requests being generated now")
                     .Register(*registry_)
                     .Add({})),
      images_(BuildCounter()
                  .Name("flux2_images_generated_total")
                  .Help("Images returned")
                  .Register(*registry_)
                  .Add({})),
      pixels_(BuildCounter()
                  .Name("flux2_pixels_generated_total")
                  .Help("Width x height of every image returned")
                  .Register(*registry_)
                  .Add({})),
      reference_images_(BuildCounter()
                            .Name("flux2_reference_images_total")
                            .Help("Reference images of the requests that returned images")
                            .Register(*registry_)
                            .Add({})),
      prompt_cache_requests_(
          BuildCounter()
              .Name("flux2_prompt_cache_requests_total")
              .Help("Generated requests by whether their prompt embeddings came from the cache")
              .Register(*registry_)),
      prompt_cache_capacity_(BuildGauge()
                                 .Name("flux2_prompt_cache_capacity_bytes")
                                 .Help("Capacity of the prompt-embedding cache (0: off)")
                                 .Register(*registry_)
                                 .Add({})),
      step_cache_forwards_(BuildCounter()
                               .Name("flux2_step_cache_forwards_total")
                               .Help("Block-list forwards of step-caching requests that finished "
                                     "generating, by list and whether they were cached")
                               .Register(*registry_)),
      step_cache_diff_(BuildHistogram()
                           .Name("flux2_step_cache_relative_diff")
                           .Help("DBCache's mean|F_prev - F| / mean|F_prev| per decided step")
                           .Register(*registry_)
                           .Add({}, diff_buckets())),
      model_load_(BuildGauge()
                      .Name("flux2_model_load_duration_seconds")
                      .Help("Weight loading + warm-up at startup")
                      .Register(*registry_)
                      .Add({})),
      ready_(BuildGauge()
                 .Name("flux2_ready")
                 .Help("1 when readiness is SERVING, else 0")
                 .Register(*registry_)
                 .Add({})),
      build_info_(BuildGauge()
                      .Name("flux2_build_info")
                      .Help("Build and model identity (always 1)")
                      .Register(*registry_)),
      gpu_used_(BuildGauge()
                    .Name("flux2_gpu_memory_used_bytes")
                    .Help("Device memory held by the backend")
                    .Register(*registry_)),
      gpu_peak_(BuildGauge()
                    .Name("flux2_gpu_memory_peak_bytes")
                    .Help("High-water mark of device memory held by the backend")
                    .Register(*registry_)),
      gpu_total_(BuildGauge()
                     .Name("flux2_gpu_memory_total_bytes")
                     .Help("Device capacity")
                     .Register(*registry_)),
      lora_(*registry_) {
  // Export zeros for the series known to exist (Prometheus practice: no missing series).
  for (const char* method : {"GenerateImage", "GenerateImageStream", "GetModelInfo",
                             "images.generations", "images.edits"}) {
    requests_.Add({{"method", method}, {"code", "OK"}});
    request_duration_.Add({{"method", method}}, request_buckets());
  }
  for (const char* code : {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED",
                           "CANCELLED", "UNAVAILABLE", "INTERNAL"}) {
    requests_.Add({{"method", "GenerateImage"}, {"code", code}});
  }
  for (Stage stage : {Stage::kTokenize, Stage::kTextEncode, Stage::kReferenceEncode,
                      Stage::kDenoise, Stage::kDecode, Stage::kEncode}) {
    stage_duration_.Add({{"stage", std::string(stage_name(stage))}}, request_buckets());
  }
  step_duration_.Add({{"quality", "lossless"}}, step_buckets());
  for (const char* result : {"hit", "miss"}) prompt_cache_requests_.Add({{"result", result}});
  for (const char* list : {"double", "single"}) {
    for (const char* decision : {"computed", "cached"}) {
      step_cache_forwards_.Add({{"list", list}, {"decision", decision}});
    }
  }
  for (const char* reason :
       {kQueueFull, kDeviceMemory, kRequestTooLarge, kResponseTooLarge, kLoraCacheFull})
    resource_exhausted_.Add({{"reason", reason}});
  for (const char* kind : {kFaultDeviceMemory, kFaultDeviceError, kFaultStall})
    engine_faults_.Add({{"kind", kind}});
}

bool Metrics::attach_gpu(const std::string& pci_bus_id, int gpu) {
  return system_->attach_gpu(pci_bus_id, gpu);
}

void Metrics::count_resource_exhausted(absl::string_view reason) {
  resource_exhausted_.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::count_engine_fault(absl::string_view kind) {
  engine_faults_.Add({{"kind", std::string(kind)}}).Increment();
}

void Metrics::set_engine_stalled(bool stalled) {
  engine_stalled_.Set(stalled ? 1.0 : 0.0);
}

void Metrics::observe_first_step(double seconds) {
  first_step_.Observe(seconds);
}

void Metrics::count_request(absl::string_view method, absl::string_view code, double seconds) {
  requests_.Add({{"method", std::string(method)}, {"code", std::string(code)}}).Increment();
  request_duration_.Add({{"method", std::string(method)}}, request_buckets()).Observe(seconds);
}

void Metrics::observe_queue(double seconds) {
  queue_duration_.Observe(seconds);
}

void Metrics::observe_stage(Stage stage, double seconds) {
  stage_duration_.Add({{"stage", std::string(stage_name(stage))}}, request_buckets())
      .Observe(seconds);
}

void Metrics::observe_step(Quality quality, double seconds) {
  step_duration_.Add({{"quality", std::string(quality_name(quality))}}, step_buckets())
      .Observe(seconds);
}

void Metrics::observe_step_collectives(int gpu, const CollectiveSeconds& seconds) {
  const std::string label = std::to_string(gpu);
  step_collectives_.Add({{"gpu", label}, {"collective", "all_to_all"}}, collective_buckets())
      .Observe(seconds.all_to_all);
  step_collectives_.Add({{"gpu", label}, {"collective", "all_gather"}}, collective_buckets())
      .Observe(seconds.all_gather);
}

std::map<int, Metrics::StepCollectiveTotals> Metrics::step_collective_totals() const {
  std::map<int, StepCollectiveTotals> totals;
  for (const prometheus::MetricFamily& family : step_collectives_.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      int gpu = -1;
      bool all_to_all = false;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "gpu") gpu = std::stoi(label.value);
        if (label.name == "collective") all_to_all = label.value == "all_to_all";
      }
      StepCollectiveTotals& total = totals[gpu];
      (all_to_all ? total.seconds.all_to_all : total.seconds.all_gather) +=
          metric.histogram.sample_sum;
      total.steps = metric.histogram.sample_count;  // the same for both kinds
    }
  }
  return totals;
}

void Metrics::set_queue_depth(int depth) {
  queue_depth_.Set(depth);
}
void Metrics::add_in_flight(int delta) {
  in_flight_.Increment(delta);
}

void Metrics::count_images(int64_t images, int64_t pixels) {
  images_.Increment(static_cast<double>(images));
  pixels_.Increment(static_cast<double>(pixels));
}

void Metrics::count_reference_images(int64_t references) {
  reference_images_.Increment(static_cast<double>(references));
}

void Metrics::count_prompt_cache(bool hit) {
  prompt_cache_requests_.Add({{"result", hit ? "hit" : "miss"}}).Increment();
}

void Metrics::observe_step_cache(const StepCacheCounts& counts, const std::vector<float>& diffs) {
  constexpr const char* kLists[2] = {"double", "single"};
  for (int list = 0; list < 2; ++list) {
    step_cache_forwards_.Add({{"list", kLists[list]}, {"decision", "computed"}})
        .Increment(static_cast<double>(counts.computed[list]));
    step_cache_forwards_.Add({{"list", kLists[list]}, {"decision", "cached"}})
        .Increment(static_cast<double>(counts.cached[list]));
  }
  for (float diff : diffs) step_cache_diff_.Observe(diff);
}

void Metrics::set_prompt_cache_capacity(int64_t bytes) {
  prompt_cache_capacity_.Set(static_cast<double>(bytes));
}

void Metrics::set_model_load_seconds(double seconds) {
  model_load_.Set(seconds);
}
void Metrics::set_ready(bool ready) {
  ready_.Set(ready ? 1.0 : 0.0);
}

void Metrics::set_build_info(absl::string_view version, absl::string_view backend,
                             absl::string_view model) {
  build_info_
      .Add({{"version", std::string(version)},
            {"backend", std::string(backend)},
            {"model", std::string(model)}})
      .Set(1.0);
}

void Metrics::set_gpu_memory(const std::vector<int>& gpus,
                             const std::vector<BackendMemoryStats>& ranks) {
  for (size_t r = 0; r < ranks.size() && r < gpus.size(); ++r) {
    const std::map<std::string, std::string> gpu = {{"gpu", std::to_string(gpus[r])}};
    gpu_used_.Add(gpu).Set(static_cast<double>(ranks[r].used_bytes));
    gpu_peak_.Add(gpu).Set(static_cast<double>(ranks[r].peak_bytes));
    gpu_total_.Add(gpu).Set(static_cast<double>(ranks[r].total_bytes));
  }
}

std::vector<std::shared_ptr<prometheus::Collectable>> Metrics::collectables() const {
  return {registry_, fast_paths_, system_};
}

std::string Metrics::render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& family : fast_paths_->Collect())
    families.push_back(std::move(family));
  for (prometheus::MetricFamily& family : system_->Collect()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace flux2::server
