// What flux2 bench's benchmarks share; see bench_options.h.
#include "server/cli/bench/bench_options.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "model/lora_targets.h"

namespace flux2 {
namespace {

// A LoRA adapter of `rank` on every Linear of `config` with random values (alpha = rank).
std::shared_ptr<const LoraAdapter> random_lora_adapter(const Flux2Config& config, int64_t rank,
                                                       uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto adapter = std::make_shared<LoraAdapter>();
  for (const auto& [name, target] : flux2_lora_targets(config)) {
    LoraModule m{name, rank, target.in_features, target.out_features, {}, {}, double(rank), false};
    m.a.resize(static_cast<size_t>(rank * m.in_features));
    m.b.resize(static_cast<size_t>(m.out_features * rank));
    const float a_scale = 1.0f / std::sqrt(static_cast<float>(m.in_features));
    for (float& v : m.a) v = uniform(rng) * a_scale;
    for (float& v : m.b) v = uniform(rng) * 0.01f;
    adapter->modules.push_back(std::move(m));
  }
  return adapter;
}

// --tune-gemm: merges the backend's timed GEMM algorithms into the table at `path`.
absl::Status write_tuned_gemms(Backend& be, const std::string& path) {
  absl::StatusOr<std::string> existing = read_file(path, "--tune-gemm");  // none yet: a new table
  FLUX_ASSIGN_OR_RETURN(const std::string table,
                        be.export_gemm_algorithms(existing.ok() ? *existing : ""));
  FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr || std::fwrite(table.data(), 1, table.size(), out) != table.size() ||
      std::fclose(out) != 0) {
    return absl::InternalError(absl::StrCat("--tune-gemm: cannot write ", path));
  }
  bench_progress(absl::StrCat("tuned GEMM algorithms merged into ", path));
  return absl::OkStatus();
}

}  // namespace

void bench_progress(absl::string_view message) {
  std::fprintf(stderr, "flux2 bench: %s\n", std::string(message).c_str());
}

nlohmann::json fallbacks_since(const std::vector<FastPathCounters>& before) {
  nlohmann::json out = nlohmann::json::object();
  for (const FastPathCounters& now : fast_path_snapshot()) {
    const FastPathCounters* then = nullptr;
    for (const FastPathCounters& b : before) then = b.path == now.path ? &b : then;
    for (const auto& [reason, count] : now.fallbacks) {
      const int64_t earlier =
          then != nullptr && then->fallbacks.count(reason) ? then->fallbacks.at(reason) : 0;
      if (count > earlier) out[now.path][reason] = count - earlier;
    }
  }
  return out;
}

absl::StatusOr<nlohmann::json> gemm_plans(Backend& be, const BenchOptions& o) {
  if (!o.tune_gemm.empty()) FLUX_RETURN_IF_ERROR(write_tuned_gemms(be, o.tune_gemm));
  return nlohmann::json(be.gemm_plan_stats());
}

std::vector<LoraRequest> random_lora_requests(const Flux2Config& config, const BenchOptions& o) {
  std::vector<LoraRequest> requests;
  if (o.lora_rank <= 0) return requests;
  for (int64_t i = 0; i < o.loras; ++i) {
    requests.push_back({absl::StrCat("random", i),
                        random_lora_adapter(config, o.lora_rank, 100 + static_cast<uint64_t>(i)),
                        i % 2 == 0 ? 0.8 : -0.5});
  }
  bench_progress(
      absl::StrCat(o.loras, " random adapter(s) of rank ", o.lora_rank, " on every Linear"));
  return requests;
}

nlohmann::json lora_result(const Flux2Config& config, const BenchOptions& o, int64_t value_bytes) {
  int64_t values = 0;  // per adapter
  for (const auto& [name, t] : flux2_lora_targets(config)) {
    values += o.lora_rank * (t.in_features + t.out_features);
  }
  return {{"lora_rank", o.lora_rank},
          {"loras", o.loras},
          {"lora_device_bytes", o.loras * values * value_bytes}};
}

}  // namespace flux2
