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
  bool initialized = false;         // nvmlInit_v2 succeeded
  std::vector<NvmlDevice> devices;  // attached, in order
  std::vector<int> labels;          // devices[i]'s label gpu: its device ordinal
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  int (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  int (*power)(NvmlDevice, unsigned int*) = nullptr;       // milliwatts
  int (*clock)(NvmlDevice, int, unsigned int*) = nullptr;  // MHz
  int (*temperature)(NvmlDevice, int, unsigned int*) = nullptr;
  std::mutex mu;  // NVML is thread-safe; this only orders attach against Collect

  ~Nvml() {
    if (initialized) shutdown();
    if (library != nullptr) dlclose(library);
  }
  // Loads and initialises NVML once; false when it is missing or fails.
  bool load() {
    if (initialized) return true;
    if (library == nullptr) library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return false;
    const bool resolved = resolve(&init, "nvmlInit_v2") && resolve(&shutdown, "nvmlShutdown") &&
                          resolve(&by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                          resolve(&utilization, "nvmlDeviceGetUtilizationRates") &&
                          resolve(&power, "nvmlDeviceGetPowerUsage") &&
                          resolve(&clock, "nvmlDeviceGetClockInfo") &&
                          resolve(&temperature, "nvmlDeviceGetTemperature");
    initialized = resolved && init() == 0;
    return initialized;
  }

  // The attached GPUs' families, each with one series per GPU (label gpu: its device ordinal),
  // after `families`.
  void collect(std::vector<prometheus::MetricFamily>& families) const {
    if (devices.empty()) return;
    const auto family = [](const char* name, const char* help) {
      return prometheus::MetricFamily{name, help, prometheus::MetricType::Gauge, {}};
    };
    std::vector<prometheus::MetricFamily> gpu = {
        family("flux2_gpu_utilization_ratio",
               "Fraction of the last sample period a kernel ran on the GPU (NVML)"),
        family("flux2_gpu_memory_busy_ratio",
               "Fraction of the last sample period device memory was read or written (NVML)"),
        family("flux2_gpu_power_watts", "GPU power draw (NVML)"),
        family("flux2_gpu_sm_clock_hertz", "SM clock (NVML)"),
        family("flux2_gpu_memory_clock_hertz", "Memory clock (NVML)"),
        family("flux2_gpu_temperature_celsius", "GPU core temperature (NVML)")};
    for (size_t i = 0; i < devices.size(); ++i) {
      const auto add = [&](size_t f, double value) {
        prometheus::ClientMetric metric;
        metric.label = {{"gpu", std::to_string(labels[i])}};
        metric.gauge.value = value;
        gpu[f].metric.push_back(std::move(metric));
      };
      NvmlUtilization rates{};
      if (utilization(devices[i], &rates) == 0) {
        add(0, rates.gpu / 100.0);
        add(1, rates.memory / 100.0);
      }
      unsigned int value = 0;
      if (power(devices[i], &value) == 0) add(2, value / 1000.0);
      if (clock(devices[i], kNvmlClockSm, &value) == 0) add(3, value * 1e6);
      if (clock(devices[i], kNvmlClockMem, &value) == 0) add(4, value * 1e6);
      if (temperature(devices[i], kNvmlTemperatureGpu, &value) == 0) add(5, value);
    }
    for (prometheus::MetricFamily& f : gpu) {
      if (!f.metric.empty()) families.push_back(std::move(f));
    }
  }

  template <typename F>
  bool resolve(F* out, const char* name) {
    *out = reinterpret_cast<F>(dlsym(library, name));
    return *out != nullptr;
  }
};

SystemMetrics::SystemMetrics() : nvml_(std::make_unique<Nvml>()) {}

SystemMetrics::~SystemMetrics() = default;

bool SystemMetrics::attach_gpu(const std::string& pci_bus_id, int gpu) {
  if (pci_bus_id.empty()) return false;
  std::lock_guard<std::mutex> lock(nvml_->mu);
  Nvml& n = *nvml_;
  if (!n.load()) return false;
  NvmlDevice device = nullptr;
  if (n.by_pci_bus_id(pci_bus_id.c_str(), &device) != 0) return false;
  n.devices.push_back(device);
  n.labels.push_back(gpu);
  return true;
}

bool SystemMetrics::gpu_attached() const {
  std::lock_guard<std::mutex> lock(nvml_->mu);
  return !nvml_->devices.empty();
}

std::optional<SystemMetrics::GpuReading> SystemMetrics::read_gpu() const {
  std::lock_guard<std::mutex> lock(nvml_->mu);
  const Nvml& n = *nvml_;
  unsigned int milliwatts = 0, mhz = 0;
  if (n.devices.empty() || n.power(n.devices[0], &milliwatts) != 0 ||
      n.clock(n.devices[0], kNvmlClockSm, &mhz) != 0) {
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
  nvml_->collect(families);
  return families;
}

}  // namespace flux2::server
