// `flux2 bench --concurrency N`: images/s and request latency percentiles through the server path
// (server/cli/bench/load_bench.h) with one client, then N clients, on one loaded model: random
// weights at a published model's shapes (--model, the GPU) or a checkpoint directory (--model-dir),
// on one GPU or split over several (--gpus N or --gpus 2,3, as flux2_server's flag: each phase then
// reports every GPU's collective time per step).
// Part of the flux2 executable itself (it links the server library, which flux2_cli_lib must not).
// Tested by the `flux2_bench_concurrency_tiny` ctest (tests/server/CMakeLists.txt); run on the GPU
// by tests/gpu/run_on_device.sh (part `throughput`).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "model/pipeline_presets.h"
#include "nlohmann/json.hpp"
#include "server/cli/bench/load_bench.h"
#include "server/cli/commands.h"
#include "server/common/backend_flags.h"
#include "server/common/command_line.h"
#include "server/common/gpus_flag.h"
#include "server/serving/parallel_engine.h"
#include "server/serving/pipeline_engine.h"

namespace flux2 {
namespace {

int fail(absl::string_view message) {
  std::fprintf(stderr, "flux2 bench --concurrency: %s\n", std::string(message).c_str());
  return 1;
}

// `flux2 bench --concurrency`'s flags, bound by add_concurrency_flags (the values are the
// defaults).
struct ConcurrencyFlags {
  int64_t concurrency = 8;
  int64_t requests = 0;  // absent: 4 x --concurrency
  std::string model = "klein-4b";
  std::string model_dir;
  int64_t height = 1024, width = 1024;
  std::string quality = "lossless";
  int64_t steps = 0, text_len = 512;
  std::string tokenizer;     // empty: the tiny checkpoint's of the model's family
  std::string backend;       // empty: cuda, or auto with --model-dir
  std::string gpus = "1";    // --gpus: a count or device ordinals (server/common/gpus_flag.h)
  std::vector<int> devices;  // --gpus parsed
  bool json = false;
  BackendOptions backend_options;
};

void add_concurrency_flags(CLI::App& app, ConcurrencyFlags& f) {
  app.add_option("--concurrency", f.concurrency);
  app.add_option("--requests", f.requests);
  app.add_option("--model", f.model);
  app.add_option("--model-dir", f.model_dir);
  app.add_option("--height", f.height);
  app.add_option("--width", f.width);
  app.add_option("--quality", f.quality);
  app.add_option("--steps", f.steps);
  app.add_option("--text-len", f.text_len);
  app.add_option("--tokenizer", f.tokenizer);
  app.add_option("--backend", f.backend);
  app.add_option("--gpus", f.gpus);
  app.add_flag("--json", f.json);
  add_backend_flags(app, f.backend_options);
}

// Checks the flags' ranges and fills in the defaults that depend on other flags.
absl::Status check_concurrency_flags(const CLI::App& app, ConcurrencyFlags& f) {
  if (f.concurrency < 1 || f.concurrency > 64) {
    return absl::InvalidArgumentError("--concurrency: expected 1..64 clients");
  }
  if (!app.count("--requests")) f.requests = 4 * f.concurrency;
  if (f.requests < 1) return absl::InvalidArgumentError("--requests: expected a positive integer");
  if (f.quality != "lossless" && f.quality != "high") {
    return absl::InvalidArgumentError(
        absl::StrCat("--quality ", f.quality, ": expected lossless or high"));
  }
  if (f.backend.empty()) f.backend = f.model_dir.empty() ? "cuda" : "auto";
  absl::StatusOr<std::vector<int>> devices = parse_gpus_flag(f.gpus);
  if (!devices.ok()) return devices.status();
  f.devices = *devices;
  if (f.tokenizer.empty()) {
    f.tokenizer =
        std::string(f.model == "dev" ? FLUX2_TINY_DEV_CHECKPOINT_DIR : FLUX2_TINY_CHECKPOINT_DIR) +
        "/tokenizer";
  }
  return absl::OkStatus();
}

// The phases as one JSON object (--json), or a line each and the throughput ratio.
void print_results(const ConcurrencyFlags& f, const std::vector<server::LoadBenchPhase>& phases) {
  nlohmann::json result = {{"concurrency", f.concurrency},
                           {"model", f.model_dir.empty() ? f.model : f.model_dir},
                           {"quality", f.quality},
                           {"width", f.width},
                           {"height", f.height},
                           {"steps", f.steps},
                           {"text_len", f.text_len},
                           {"requests_per_phase", f.requests},
                           {"gpus", f.devices},
                           {"phases", nlohmann::json::array()}};
  for (const server::LoadBenchPhase& phase : phases) result["phases"].push_back(phase.to_json());
  const double sequential = phases.front().images_per_second;
  result["throughput_ratio"] = sequential > 0 ? phases.back().images_per_second / sequential : 0.0;
  if (f.json) {
    std::printf("%s\n", result.dump().c_str());
    return;
  }
  for (const server::LoadBenchPhase& phase : phases) {
    std::printf(
        "%d clients, %d requests of %lldx%lld %s: %.3f images/s, latency p50 %.1f ms, p90 %.1f, "
        "p99 %.1f, max %.1f\n",
        phase.clients, phase.requests, static_cast<long long>(f.width),
        static_cast<long long>(f.height), f.quality.c_str(), phase.images_per_second, phase.p50_ms,
        phase.p90_ms, phase.p99_ms, phase.max_ms);
    for (const auto& [gpu, total] : phase.collectives) {
      const double steps = static_cast<double>(std::max<uint64_t>(total.steps, 1));
      std::printf("  gpu %d: all-to-all %.3f ms, all-gather %.3f ms per step (%llu steps)\n", gpu,
                  1e3 * total.seconds.all_to_all / steps, 1e3 * total.seconds.all_gather / steps,
                  static_cast<unsigned long long>(total.steps));
    }
  }
  std::printf("throughput ratio (last phase / one client): %.3f\n",
              result["throughput_ratio"].get<double>());
}

}  // namespace

int run_bench_concurrency(int argc, char** argv, int first) {
  CommandLine app("flux2 bench --concurrency");
  ConcurrencyFlags flags;
  add_concurrency_flags(app, flags);
  absl::Status parsed = app.parse_flags(argc, argv, first);
  if (parsed.ok()) parsed = check_concurrency_flags(app, flags);
  if (!parsed.ok()) return fail(parsed.message());
  server::LoadBenchOptions options;
  options.clients = flags.concurrency == 1
                        ? std::vector<int>{1}
                        : std::vector<int>{1, static_cast<int>(flags.concurrency)};
  options.requests = static_cast<int>(flags.requests);
  options.width = flags.width;
  options.height = flags.height;
  options.steps = static_cast<int>(flags.steps);
  options.quality = flags.quality == "high" ? Quality::kHigh : Quality::kLossless;

  server::ServerOptions server_options;
  server_options.backend_options = flags.backend_options;
  server_options.gpus = flags.devices;
  server_options.enable_quality_high = options.quality == Quality::kHigh;
  server_options.max_sequence_length = static_cast<int>(flags.text_len);
  server_options.max_response_bytes = int64_t{64} << 20;  // noisy random-weight PNGs are large
  server_options.max_pixels =
      std::max<int64_t>(server_options.max_pixels, flags.width * flags.height);
  server::EngineFactory factory;  // null: the server loads --model-dir as flux2_server does
  if (!flags.model_dir.empty()) {
    server_options.model_dir = flags.model_dir;
    server_options.backend = flags.backend;
  } else {
    auto spec = random_pipeline_spec(flags.model, flags.tokenizer);
    if (!spec.ok()) return fail(spec.status().message());
    spec->enable_quality_high = server_options.enable_quality_high;
    factory = [backend_name = flags.backend, backend_options = flags.backend_options,
               devices = flags.devices,
               spec = *spec]() -> absl::StatusOr<std::unique_ptr<server::Engine>> {
      if (devices.size() > 1) {
        return server::random_parallel_engine(devices, backend_name, backend_options, spec);
      }
      absl::StatusOr<std::unique_ptr<Backend>> backend =
          create_backend(backend_name, backend_options);
      if (!backend.ok()) return backend.status();
      return server::random_pipeline_engine(std::move(*backend), spec);
    };
  }
  auto phases = server::run_load_bench(server_options, std::move(factory), options);
  if (!phases.ok()) return fail(phases.status().message());
  print_results(flags, *phases);
  return 0;
}

}  // namespace flux2
