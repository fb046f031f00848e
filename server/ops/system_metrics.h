// Process and GPU telemetry read at scrape time, for /metrics beside the request metrics: the
// Prometheus client conventions' process_* families (CPU seconds, resident and virtual memory, open
// and maximum file descriptors, start time; from /proc/self) and, once attached to the serving
// GPUs, NVML's utilisation, power, clocks and temperature, one series per GPU (label gpu). NVML
// (libnvidia-ml.so.1, which the NVIDIA driver and container toolkit provide) is dlopen'd as
// cuBLASLt is, so CPU builds and hosts without a driver still run and export no GPU families.
// Tested by tests/server/system_metrics_test.cc (process families on every machine; the NVML
// families on the H200 through the GPU runner's server part).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace flux2::server {

class SystemMetrics final : public prometheus::Collectable {
 public:
  SystemMetrics();
  ~SystemMetrics() override;

  // Attaches the GPU whose PCI bus id is `pci_bus_id` (PipelineInfo::device_pci_bus_id); each
  // call attaches one more (--gpus: one per rank), whose series carry the label gpu="<gpu>" (its
  // device ordinal). Returns whether NVML loaded and found it; "" (the CPU backend) attaches
  // nothing.
  bool attach_gpu(const std::string& pci_bus_id, int gpu);
  bool gpu_attached() const;

  // One reading of the first attached GPU's SM clock and board power (`flux2 bench` samples them
  // beside its step times); nullopt when no GPU is attached or NVML fails.
  struct GpuReading {
    double sm_clock_mhz = 0.0;
    double power_watts = 0.0;
  };
  std::optional<GpuReading> read_gpu() const;

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace flux2::server
