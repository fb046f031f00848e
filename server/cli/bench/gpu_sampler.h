// The GPU's SM clock and board power while a timed section of `flux2 bench` runs, so step times
// measured on different runs (or power-capped machines) can be compared: NVML readings
// (server/ops/system_metrics.h) every 10 ms on a thread. Run by the GPU runner's benches; on a
// host without a GPU or NVML it reports nothing. Tested by tests/server/gpu_sampler_test.cc (the
// summary and the fields; a sampler with no GPU).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/ops/system_metrics.h"

namespace flux2 {

// What the samples of one section say.
struct GpuClockPower {
  double sm_clock_mhz_median = 0.0;
  double power_watts_mean = 0.0;
  int samples = 0;
};

class GpuSampler {
 public:
  // Starts sampling the GPU of `pci_bus_id` (Backend::device_pci_bus_id); "" samples nothing.
  explicit GpuSampler(const std::string& pci_bus_id);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  // Stops sampling: the summary, or nullopt without a reading.
  std::optional<GpuClockPower> stop();

 private:
  server::SystemMetrics nvml_;
  std::atomic<bool> running_{false};
  std::vector<server::SystemMetrics::GpuReading> readings_;  // written by the thread until stop()
  std::thread thread_;
};

// The summary of `readings`: the SM clock's median, the power's mean; nullopt without a reading.
std::optional<GpuClockPower> summarize_gpu_readings(
    const std::vector<server::SystemMetrics::GpuReading>& readings);

// The bench's JSON fields for a section ("sm_clock_mhz_median", "power_watts_mean",
// "gpu_samples", each after `prefix`: "without_lora_" for the steps a ratio divides by), nothing
// without a summary.
void add_clock_power(const std::optional<GpuClockPower>& summary, nlohmann::json& result,
                     const std::string& prefix = "");
// " at 1980 MHz, 650 W" for the bench's printed line, from a result add_clock_power filled; ""
// without those fields.
std::string clock_power_text(const nlohmann::json& result);

}  // namespace flux2
