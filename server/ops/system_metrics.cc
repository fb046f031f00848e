// Process and NVML telemetry at scrape time; see system_metrics.h.
// Tested by tests/server/system_metrics_test.cc.
#include "server/ops/system_metrics.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <sstream>

namespace flux2::server {
namespace {

prometheus::MetricFamily gauge(const char* name, const char* help, double value,
                               prometheus::MetricType type = prometheus::MetricType::Gauge) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {metric}};
}

// Fields of /proc/self/stat after the command name (which may hold spaces): field 14 of proc(5)
// (utime) is index 11 here.
std::vector<std::string> stat_fields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 2));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

int open_fds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

// Boot time (btime of /proc/stat), for the process start time.
double boot_time_seconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double value = 0;
      in >> value;
      return value;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

// NVML's C ABI, the few calls used (nvml.h: return codes are ints, 0 is NVML_SUCCESS).
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of time a kernel ran
  unsigned int memory;  // percent of time device memory was read or written
};
constexpr int kNvmlClockSm = 1;
constexpr int kNvmlClockMem = 2;
constexpr int kNvmlTemperatureGpu = 0;

}  // namespace

struct SystemMetrics::Nvml {
  void* library = nullptr;
  NvmlDevice device = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  int (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  int (*power)(NvmlDevice, unsigned int*) = nullptr;       // milliwatts
  int (*clock)(NvmlDevice, int, unsigned int*) = nullptr;  // MHz
  int (*temperature)(NvmlDevice, int, unsigned int*) = nullptr;
  std::mutex mu;  // NVML is thread-safe; this only orders attach against Collect

  ~Nvml() {
    if (shutdown != nullptr && device != nullptr) shutdown();
    if (library != nullptr) dlclose(library);
  }

  template <typename F>
  bool resolve(F* out, const char* name) {
    *out = reinterpret_cast<F>(dlsym(library, name));
    return *out != nullptr;
  }
};

SystemMetrics::SystemMetrics() : nvml_(std::make_unique<Nvml>()) {}

SystemMetrics::~SystemMetrics() = default;

bool SystemMetrics::attach_gpu(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return false;
  std::lock_guard<std::mutex> lock(nvml_->mu);
  if (nvml_->device != nullptr) return true;
  Nvml& n = *nvml_;
  n.library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n.library == nullptr) return false;
  const bool resolved = n.resolve(&n.init, "nvmlInit_v2") &&
                        n.resolve(&n.shutdown, "nvmlShutdown") &&
                        n.resolve(&n.by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                        n.resolve(&n.utilization, "nvmlDeviceGetUtilizationRates") &&
                        n.resolve(&n.power, "nvmlDeviceGetPowerUsage") &&
                        n.resolve(&n.clock, "nvmlDeviceGetClockInfo") &&
                        n.resolve(&n.temperature, "nvmlDeviceGetTemperature");
  if (!resolved || n.init() != 0) return false;
  NvmlDevice device = nullptr;
  if (n.by_pci_bus_id(pci_bus_id.c_str(), &device) != 0) {
    n.shutdown();
    return false;
  }
  n.device = device;
  return true;
}

bool SystemMetrics::gpu_attached() const {
  std::lock_guard<std::mutex> lock(nvml_->mu);
  return nvml_->device != nullptr;
}

std::optional<SystemMetrics::GpuReading> SystemMetrics::read_gpu() const {
  std::lock_guard<std::mutex> lock(nvml_->mu);
  const Nvml& n = *nvml_;
  unsigned int milliwatts = 0, mhz = 0;
  if (n.device == nullptr || n.power(n.device, &milliwatts) != 0 ||
      n.clock(n.device, kNvmlClockSm, &mhz) != 0) {
    return std::nullopt;
  }
  return GpuReading{static_cast<double>(mhz), milliwatts / 1000.0};
}

std::vector<prometheus::MetricFamily> SystemMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> families;
  const std::vector<std::string> stat = stat_fields();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  if (stat.size() > 21) {
    const double cpu = (std::stod(stat[11]) + std::stod(stat[12])) / ticks;  // utime + stime
    families.push_back(gauge("process_cpu_seconds_total", "User and system CPU time spent", cpu,
                             prometheus::MetricType::Counter));
    families.push_back(
        gauge("process_virtual_memory_bytes", "Virtual memory size", std::stod(stat[20])));
    families.push_back(
        gauge("process_resident_memory_bytes", "Resident memory size", std::stod(stat[21]) * page));
    families.push_back(gauge("process_start_time_seconds", "Start time since the Unix epoch",
                             boot_time_seconds() + std::stod(stat[19]) / ticks));
  }
  families.push_back(
      gauge("process_open_fds", "Open file descriptors", static_cast<double>(open_fds())));
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    families.push_back(gauge("process_max_fds", "Maximum open file descriptors",
                             static_cast<double>(limit.rlim_cur)));
  }

  std::lock_guard<std::mutex> lock(nvml_->mu);
  const Nvml& n = *nvml_;
  if (n.device == nullptr) return families;
  NvmlUtilization utilization{};
  if (n.utilization(n.device, &utilization) == 0) {
    families.push_back(gauge("flux2_gpu_utilization_ratio",
                             "Fraction of the last sample period a kernel ran on the GPU (NVML)",
                             utilization.gpu / 100.0));
    families.push_back(gauge("flux2_gpu_memory_busy_ratio",
                             "Fraction of the last sample period device memory was read or "
                             "written (NVML)",
                             utilization.memory / 100.0));
  }
  unsigned int value = 0;
  if (n.power(n.device, &value) == 0) {
    families.push_back(gauge("flux2_gpu_power_watts", "GPU power draw (NVML)", value / 1000.0));
  }
  if (n.clock(n.device, kNvmlClockSm, &value) == 0) {
    families.push_back(
        gauge("flux2_gpu_sm_clock_hertz", "SM clock (NVML)", static_cast<double>(value) * 1e6));
  }
  if (n.clock(n.device, kNvmlClockMem, &value) == 0) {
    families.push_back(gauge("flux2_gpu_memory_clock_hertz", "Memory clock (NVML)",
                             static_cast<double>(value) * 1e6));
  }
  if (n.temperature(n.device, kNvmlTemperatureGpu, &value) == 0) {
    families.push_back(gauge("flux2_gpu_temperature_celsius", "GPU core temperature (NVML)",
                             static_cast<double>(value)));
  }
  return families;
}

}  // namespace flux2::server
