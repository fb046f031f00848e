// `flux2 bench --lora-load-mb`; see lora_load_bench.h.
#include "server/cli/bench/lora_load_bench.h"

#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/dtype.h"
#include "kernels/base/status.h"
#include "model/lora_device_cache.h"
#include "model/lora_targets.h"
#include "model/safetensors.h"
#include "server/serving/lora_registry.h"

namespace flux2 {
namespace {

using Clock = std::chrono::steady_clock;
using server::LoraRegistry;
using server::LoraRegistryOptions;
using server::ResolvedLora;

constexpr int64_t kDeviceCacheBytes = int64_t{16} << 30;  // every adapter of the run stays

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// [rows, cols] uniform in ±scale, as bf16.
SafetensorsBlob random_bf16(int64_t rows, int64_t cols, float scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  SafetensorsBlob blob{"BF16", {rows, cols}, {}};
  blob.bytes.resize(static_cast<size_t>(rows * cols * 2));
  for (size_t i = 0; i < blob.bytes.size(); i += 2) {
    const uint16_t bits = f32_to_bf16_bits(uniform(rng));
    blob.bytes[i] = static_cast<uint8_t>(bits & 0xff);
    blob.bytes[i + 1] = static_cast<uint8_t>(bits >> 8);
  }
  return blob;
}

// An adapter of `rank` on every Linear of `config` in diffusers' layout (no metadata: alpha = r).
absl::Status write_random_adapter(const std::string& path, const Flux2Config& config, int64_t rank,
                                  uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::map<std::string, SafetensorsBlob> tensors;
  for (const auto& [name, t] : flux2_lora_targets(config)) {
    const float a_scale = 1.0f / std::sqrt(static_cast<float>(t.in_features));
    tensors["transformer." + name + ".lora_A.weight"] =
        random_bf16(rank, t.in_features, a_scale, rng);
    tensors["transformer." + name + ".lora_B.weight"] =
        random_bf16(t.out_features, rank, 0.01f, rng);
  }
  return write_safetensors(path, tensors);
}

// Bytes of an adapter of rank 1 on every Linear, in bf16.
int64_t bytes_per_rank(const Flux2Config& config) {
  int64_t values = 0;
  for (const auto& [name, t] : flux2_lora_targets(config)) values += t.in_features + t.out_features;
  return 2 * values;
}

// The first use of one large adapter: header, host load, cached resolve, upload, resident reuse.
absl::StatusOr<nlohmann::json> time_first_use(Backend& be, const Flux2Config& config,
                                              LoraRegistry& registry, const std::string& path) {
  nlohmann::json r;
  Clock::time_point start = Clock::now();
  FLUX_ASSIGN_OR_RETURN(auto header, SafetensorsFile::open(path));
  r["ms_header_check"] = ms_since(start);
  r["tensors"] = header->entries().size();
  start = Clock::now();
  FLUX_ASSIGN_OR_RETURN(ResolvedLora lora, registry.resolve("large"));
  r["ms_host_load_first"] = ms_since(start);
  start = Clock::now();
  FLUX_RETURN_IF_ERROR(registry.resolve("large").status());
  r["ms_host_load_cached"] = ms_since(start);
  LoraDeviceCache cache(kDeviceCacheBytes);
  const std::vector<LoraRequest> requests = {{lora.sha256, lora.adapter, 1.0, lora.image}};
  for (const char* key : {"ms_upload_first", "ms_upload_resident"}) {
    start = Clock::now();
    FLUX_RETURN_IF_ERROR(cache.acquire(be, config, requests).status());
    FLUX_RETURN_IF_ERROR(be.synchronize());
    r[key] = ms_since(start);
  }
  r["file_bytes"] = lora.file_bytes;
  r["upload_image_bytes"] = lora.image != nullptr ? lora.image->bytes() : 0;
  r["device_bytes"] = cache.stats().bytes;
  return r;
}

// 8 adapters requested in turn, twice: each request's resolve + acquire.
absl::StatusOr<nlohmann::json> time_switching(Backend& be, const Flux2Config& config,
                                              LoraRegistry& registry, int count) {
  LoraDeviceCache cache(kDeviceCacheBytes);  // room for all: the second round finds them resident
  nlohmann::json rounds = nlohmann::json::array();
  for (int round = 0; round < 2; ++round) {
    std::vector<double> ms;
    for (int i = 0; i < count; ++i) {
      const Clock::time_point start = Clock::now();
      FLUX_ASSIGN_OR_RETURN(ResolvedLora lora, registry.resolve(absl::StrCat("switch", i)));
      const std::vector<LoraRequest> requests = {{lora.sha256, lora.adapter, 1.0, lora.image}};
      FLUX_RETURN_IF_ERROR(cache.acquire(be, config, requests).status());
      FLUX_RETURN_IF_ERROR(be.synchronize());
      ms.push_back(ms_since(start));
    }
    rounds.push_back(ms);
  }
  return rounds;
}

}  // namespace

absl::StatusOr<nlohmann::json> bench_lora_load(Backend& backend, const Flux2Config& config,
                                               int64_t megabytes) {
  char pattern[] = "/tmp/flux2-lora-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("cannot make a temporary folder");
  const std::string dir = pattern;
  const int64_t rank =
      std::max<int64_t>(1, (megabytes << 20) / bytes_per_rank(config));  // rounded down
  constexpr int kSwitch = 8;
  std::fprintf(stderr, "flux2 bench: writing a rank-%lld adapter and %d of rank 32 to %s\n",
               static_cast<long long>(rank), kSwitch, dir.c_str());
  FLUX_RETURN_IF_ERROR(write_random_adapter(dir + "/large.safetensors", config, rank, 1));
  for (int i = 0; i < kSwitch; ++i) {
    FLUX_RETURN_IF_ERROR(write_random_adapter(absl::StrCat(dir, "/switch", i, ".safetensors"),
                                              config, 32, 10 + static_cast<uint64_t>(i)));
  }
  LoraRegistryOptions options;
  options.dir = dir;
  options.max_rank = std::max<int64_t>(rank, 32);
  options.make_host_image = lora_host_image_maker(backend, config);  // as the server does
  FLUX_ASSIGN_OR_RETURN(auto registry, LoraRegistry::open(options, config, nullptr));
  nlohmann::json result;
  result["lora_load"] = true;
  result["rank"] = rank;
  FLUX_ASSIGN_OR_RETURN(result["first_use"],
                        time_first_use(backend, config, *registry, dir + "/large.safetensors"));
  FLUX_ASSIGN_OR_RETURN(result["switching_ms"],
                        time_switching(backend, config, *registry, kSwitch));
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace flux2
