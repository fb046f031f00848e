// The Prometheus metrics of flux2_server, exactly as server/ops/METRICS.md lists them (names,
// labels, buckets). One Metrics object per server; every method is thread-safe. The Exposer that
// serves them over HTTP lives in server.cc. Tested by tests/server/metrics_test.cc and the
// end-to-end test.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/base/communicator.h"
#include "model/pipeline.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/ops/lora_metrics.h"
#include "server/ops/system_metrics.h"

namespace flux2::server {

// Per-request stages of flux2_stage_duration_seconds{stage}.
enum class Stage : uint8_t {
  kTokenize,    // prompt (and negative prompt) -> token ids
  kTextEncode,  // Qwen3 text encoder
  // VAE encoder over the reference images (observed only for requests with references)
  kReferenceEncode,
  kDenoise,  // noise, conditioning and every denoising step
  kDecode,   // VAE decode to 8-bit pixels
  kEncode,   // PNG / JPEG encoding
};

class Metrics {
 public:
  Metrics();

  // RPC layer: one finished RPC (`code` is the gRPC code name, e.g. "OK").
  void count_request(absl::string_view method, absl::string_view code, double seconds);
  // Worker: time a request waited in the admission queue.
  void observe_queue(double seconds);
  void observe_stage(Stage stage, double seconds);
  void observe_step(Quality quality, double seconds);
  // Multi-rank engines (--gpus with 2 or more): one denoising step's collective time on the rank
  // whose device ordinal is `gpu` (GenerateHooks::on_step_collectives), one observation per kind.
  void observe_step_collectives(int gpu, const CollectiveSeconds& seconds);
  // What flux2_denoise_step_collective_seconds holds so far, by gpu: the steps observed and the
  // seconds summed by kind (`flux2 bench --concurrency --gpus` reports a phase's difference).
  struct StepCollectiveTotals {
    uint64_t steps = 0;
    CollectiveSeconds seconds;
  };
  std::map<int, StepCollectiveTotals> step_collective_totals() const;
  void set_queue_depth(int depth);
  void add_in_flight(int delta);
  void count_images(int64_t images, int64_t pixels);
  // Reference images of a request that returned its images (counted with count_images).
  void count_reference_images(int64_t references);
  // One request that finished generating: `hit` when its prompt embeddings came from the
  // prompt-embedding cache (no text encode), else a miss (also every request with the cache off).
  void count_prompt_cache(bool hit);
  // A step-caching request that finished generating: its forwards per block list, computed and
  // cached (model/step_cache.h StepCacheCounts, summed over its images), and every diff.
  void observe_step_cache(const StepCacheCounts& counts, const std::vector<float>& diffs);
  // The prompt-embedding cache's capacity in bytes (0: off), set once the model is loaded.
  void set_prompt_cache_capacity(int64_t bytes);
  void set_model_load_seconds(double seconds);
  void set_ready(bool ready);
  void set_build_info(absl::string_view version, absl::string_view backend,
                      absl::string_view model);
  // Exported only once called (CUDA only): one series per rank of the engine
  // (Engine::memory_stats), labelled with its device ordinal, gpus[r] (Engine::device_ordinals).
  void set_gpu_memory(const std::vector<int>& gpus, const std::vector<BackendMemoryStats>& ranks);
  // NVML telemetry of a serving GPU, one call per rank (server/ops/system_metrics.h), labelled
  // gpu="<gpu>" (its device ordinal); false when NVML is missing or does not know the device
  // (then it exports nothing for it).
  bool attach_gpu(const std::string& pci_bus_id, int gpu);
  // A request refused or failed with RESOURCE_EXHAUSTED, by why (ResourceExhaustedReason).
  void count_resource_exhausted(absl::string_view reason);
  // A device fault or a stall, by kind (EngineFaultKind), counted once where it is detected.
  void count_engine_fault(absl::string_view kind);
  // The stall watchdog's verdict on the running stage.
  void set_engine_stalled(bool stalled);
  // Arrival to the end of the request's first denoising step (its first progress event).
  void observe_first_step(double seconds);

  // The LoRA families (flux2_lora_*).
  LoraMetrics& lora() { return lora_; }

  // What the Exposer serves: the registry plus the fast-path collector.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables() const;
  // The text exposition format of everything (tests).
  std::string render() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> fast_paths_;
  std::shared_ptr<SystemMetrics> system_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Histogram& queue_duration_;
  prometheus::Histogram& first_step_;
  prometheus::Family<prometheus::Counter>& resource_exhausted_;
  prometheus::Family<prometheus::Counter>& engine_faults_;
  prometheus::Gauge& engine_stalled_;
  prometheus::Family<prometheus::Histogram>& stage_duration_;
  prometheus::Family<prometheus::Histogram>& step_duration_;
  prometheus::Family<prometheus::Histogram>& step_collectives_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& in_flight_;
  prometheus::Counter& images_;
  prometheus::Counter& pixels_;
  prometheus::Counter& reference_images_;
  prometheus::Family<prometheus::Counter>& prompt_cache_requests_;
  prometheus::Gauge& prompt_cache_capacity_;
  prometheus::Family<prometheus::Counter>& step_cache_forwards_;
  prometheus::Histogram& step_cache_diff_;
  prometheus::Gauge& model_load_;
  prometheus::Gauge& ready_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Gauge>& gpu_used_;
  prometheus::Family<prometheus::Gauge>& gpu_peak_;
  prometheus::Family<prometheus::Gauge>& gpu_total_;
  LoraMetrics lora_;
};

// Label values of flux2_resource_exhausted_total{reason}: RESOURCE_EXHAUSTED told apart.
inline constexpr char kQueueFull[] = "queue_full";                 // admission queue full (429)
inline constexpr char kDeviceMemory[] = "device_memory";           // out of GPU memory in a request
inline constexpr char kRequestTooLarge[] = "request_too_large";    // body over --max-request-bytes
inline constexpr char kResponseTooLarge[] = "response_too_large";  // over --max-response-bytes
inline constexpr char kLoraCacheFull[] = "lora_cache";  // adapters over --lora-cache-bytes

// Label values of flux2_engine_faults_total{kind}.
inline constexpr char kFaultDeviceMemory[] = "device_memory";  // a request ran out of GPU memory
inline constexpr char kFaultDeviceError[] = "device_error";    // a sticky CUDA error: exit
inline constexpr char kFaultStall[] = "stall";                 // the stall watchdog fired

// The label value of flux2_stage_duration_seconds for `stage`.
absl::string_view stage_name(Stage stage);
// "lossless" / "high".
absl::string_view quality_name(Quality quality);

}  // namespace flux2::server
