// GpuSampler; see gpu_sampler.h.
#include "server/cli/bench/gpu_sampler.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"

namespace flux2 {

GpuSampler::GpuSampler(const std::string& pci_bus_id) {
  if (!nvml_.attach_gpu(pci_bus_id, 0)) return;  // the one GPU it reads
  running_ = true;
  thread_ = std::thread([this] {
    while (running_) {
      if (auto reading = nvml_.read_gpu()) readings_.push_back(*reading);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
}

GpuSampler::~GpuSampler() {
  stop();
}

std::optional<GpuClockPower> GpuSampler::stop() {
  running_ = false;
  if (thread_.joinable()) thread_.join();
  return summarize_gpu_readings(readings_);
}

std::optional<GpuClockPower> summarize_gpu_readings(
    const std::vector<server::SystemMetrics::GpuReading>& readings) {
  if (readings.empty()) return std::nullopt;
  std::vector<double> clocks;
  double watts = 0.0;
  for (const server::SystemMetrics::GpuReading& r : readings) {
    clocks.push_back(r.sm_clock_mhz);
    watts += r.power_watts;
  }
  std::sort(clocks.begin(), clocks.end());
  return GpuClockPower{clocks[clocks.size() / 2], watts / static_cast<double>(readings.size()),
                       static_cast<int>(readings.size())};
}

void add_clock_power(const std::optional<GpuClockPower>& summary, nlohmann::json& result,
                     const std::string& prefix) {
  if (!summary) return;
  result[prefix + "sm_clock_mhz_median"] = summary->sm_clock_mhz_median;
  result[prefix + "power_watts_mean"] = summary->power_watts_mean;
  result[prefix + "gpu_samples"] = summary->samples;
}

std::string clock_power_text(const nlohmann::json& result) {
  if (!result.contains("sm_clock_mhz_median")) return "";
  return absl::StrFormat(" at %.0f MHz, %.0f W", result["sm_clock_mhz_median"].get<double>(),
                         result["power_watts_mean"].get<double>());
}

}  // namespace flux2
