// The engine the server drives: a loaded model that turns GenerateParams into pixels. The real one
// wraps model/pipeline.h (server/serving/pipeline_engine.h); tests substitute a fake that sleeps
// per step (tests/server/fake_engine.h) so queueing, cancellation and drain are testable without a
// model.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "model/field_violation.h"
#include "model/lora_host_image.h"
#include "model/pipeline.h"

namespace flux2::server {

class Engine {
 public:
  virtual ~Engine() = default;

  // The loaded model; immutable after load.
  virtual const PipelineInfo& info() const = 0;
  // The model's own refusals of `params` (Pipeline::check), each naming its field; empty when
  // the model takes them. Thread-safe: the front ends call it while the worker generates.
  virtual std::vector<FieldViolation> check(const GenerateParams& params) const = 0;
  // One image. Calls hooks.check_continue at every stage boundary (text encoder, each step, VAE
  // decode) and hooks.on_step after each step, one call at a time, possibly from a thread of the
  // engine's own while the caller waits (the engine over several GPUs: its rank 0's thread); the
  // engine over several GPUs also calls hooks.on_step_collectives from every rank's thread.
  // Worker thread only.
  virtual absl::StatusOr<GeneratedImage> generate(const GenerateParams& params,
                                                  const GenerateHooks& hooks) = 0;
  // Device memory held by each rank's backend, in rank order: one entry for an engine on one
  // device, one per GPU for --gpus N (zeros on the CPU). Worker thread only.
  virtual std::vector<BackendMemoryStats> memory_stats() const = 0;
  // After a failed generate(): non-OK when the device is broken for good (Backend::device_status;
  // the process must restart). Worker thread only.
  virtual absl::Status device_status() = 0;
  // TEST ONLY (--test-inject-fault): Backend::inject_fault. Worker thread only, or from a hook
  // during generate().
  virtual absl::Status inject_fault(InjectedFault fault, double hang_seconds) = 0;

  // Each rank's device (Backend::device_pci_bus_id, for NVML), in rank order; "" on the CPU.
  virtual std::vector<std::string> device_pci_bus_ids() const { return {info().device_pci_bus_id}; }
  // Each rank's device ordinal, in rank order: the `gpu` label of the per-GPU metrics (--gpus'
  // ordinals; {0} for an engine on one device).
  virtual std::vector<int> device_ordinals() const { return {0}; }
  // The transformer's shapes (its heads decide --gpus); null for engines without one (fakes).
  virtual const Flux2Config* transformer_config() const { return nullptr; }
  // LoRA adapters (GenerateParams::loras): the transformer shapes they are parsed against; null
  // when this engine takes none. Thread-safe.
  virtual const Flux2Config* lora_config() const { return nullptr; }
  // Packs adapters for this engine's device as they are loaded, so an upload is one copy
  // (LoraRegistryOptions::make_host_image); null when it takes none. Thread-safe, as is the maker.
  virtual LoraHostImageMaker lora_host_image_maker() const { return nullptr; }
  // Uploads `lora` and keeps it on the device for good (--lora-preload). Worker thread only.
  virtual absl::Status pin_lora(const LoraRequest& lora) const {
    return absl::UnimplementedError(
        absl::StrCat("this engine takes no LoRA adapters (", lora.key, ")"));
  }
  // The device adapter cache's counters; none without one. Thread-safe.
  virtual std::optional<LoraCacheStats> lora_cache_stats() const { return std::nullopt; }
  // Whether the adapter of content key `key` is on the device now. Thread-safe.
  virtual bool lora_resident(const std::string& key) const {
    (void)key;
    return false;
  }
};

// TEST ONLY (--test-inject-fault KIND[@STEP][:SECONDS]): the fault the engine worker provokes once,
// at the stage boundary before denoising step `step` of the first request that gets there.
struct TestFault {
  InjectedFault fault = InjectedFault::kHang;
  int step = 1;
  double hang_seconds = 10.0;  // kHang only
  std::string flag;            // the flag's text, as GetModelInfo reports it
};

// Creates the engine; runs on the worker thread, so loading never blocks the RPC threads.
using EngineFactory = std::function<absl::StatusOr<std::unique_ptr<Engine>>()>;

}  // namespace flux2::server
