// The process and GPU telemetry of server/ops/system_metrics.h: the process_* families are exported
// with plausible values on every machine (CPU time and memory grow with work, open descriptors
// follow opened files); a device NVML does not know attaches nothing and exports no GPU families.
// On the H200 the GPU runner's server part checks the NVML families of a real server.
// Run: build/bin/server_unit_tests --gtest_filter='SystemMetrics*'
#include "server/ops/system_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>

#include "gtest/gtest.h"

namespace flux2::server {
namespace {

std::map<std::string, double> values(const SystemMetrics& metrics) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    const prometheus::ClientMetric& m = family.metric.at(0);
    out[family.name] =
        family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  return out;
}

TEST(SystemMetricsTest, ProcessFamiliesArePlausible) {
  SystemMetrics metrics;
  std::map<std::string, double> v = values(metrics);
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                           "process_start_time_seconds"}) {
    EXPECT_TRUE(v.count(name)) << name;
  }
  EXPECT_GT(v["process_resident_memory_bytes"], 1 << 20);
  EXPECT_GE(v["process_virtual_memory_bytes"], v["process_resident_memory_bytes"]);
  EXPECT_GT(v["process_start_time_seconds"], 1.6e9);  // after 2020
  EXPECT_LE(v["process_start_time_seconds"], static_cast<double>(time(nullptr)) + 1);
  EXPECT_GT(v["process_max_fds"], v["process_open_fds"]);

  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(values(metrics)["process_open_fds"], v["process_open_fds"] + 1);
  close(fd);
  // Burn some CPU: the counter moves forward.
  volatile double sink = 0;
  for (int i = 0; i < 50000000; ++i) sink = sink + i * 1e-9;
  EXPECT_GT(values(metrics)["process_cpu_seconds_total"], v["process_cpu_seconds_total"]);
}

TEST(SystemMetricsTest, AnUnknownDeviceAttachesNoGpuFamilies) {
  SystemMetrics metrics;
  EXPECT_FALSE(metrics.attach_gpu("", 0));
  EXPECT_FALSE(metrics.attach_gpu("ffff:ff:1f.7", 0));  // no such PCI device, or no NVML at all
  EXPECT_FALSE(metrics.gpu_attached());
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    EXPECT_EQ(family.name.rfind("flux2_gpu_", 0), std::string::npos) << family.name;
  }
}

}  // namespace
}  // namespace flux2::server
