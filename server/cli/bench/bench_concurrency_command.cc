// `flux2 bench --concurrency N`: images/s and request latency percentiles through the server path
// (server/cli/bench/load_bench.h) with one client, then N clients, on one loaded model: random
// weights at a published model's shapes (--model, the GPU) or a checkpoint directory (--model-dir).
// Part of the flux2 executable itself (it links the server library, which flux2_cli_lib must not).
// Tested by the `flux2_bench_concurrency_tiny` ctest (tests/server/CMakeLists.txt); run on the GPU
// by tests/gpu/run_on_device.sh (part `throughput`).
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend_factory.h"
#include "model/pipeline_presets.h"
#include "nlohmann/json.hpp"
#include "server/cli/bench/load_bench.h"
#include "server/cli/commands.h"
#include "server/common/args.h"
#include "server/common/backend_flags.h"
#include "server/serving/pipeline_engine.h"

namespace flux2 {
namespace {

int fail(absl::string_view message) {
  std::fprintf(stderr, "flux2 bench --concurrency: %s\n", std::string(message).c_str());
  return 1;
}

}  // namespace

int run_bench_concurrency(int argc, char** argv, int first) {
  auto args = Args::parse(argc, argv, first, {"--json"});
  if (!args.ok()) return fail(args.status().message());
  std::set<std::string> known = {"--concurrency", "--requests",  "--model",   "--model-dir",
                                 "--height",      "--width",     "--quality", "--steps",
                                 "--text-len",    "--tokenizer", "--backend", "--json"};
  known.insert(backend_flag_names().begin(), backend_flag_names().end());
  if (auto checked = args->check_known(known); !checked.ok()) return fail(checked.message());
  auto backend_options = parse_backend_flags(*args);
  if (!backend_options.ok()) return fail(backend_options.status().message());
  auto concurrency = args->get_int("--concurrency", 8);
  auto height = args->get_int("--height", 1024), width = args->get_int("--width", 1024);
  auto steps = args->get_int("--steps", 0), text_len = args->get_int("--text-len", 512);
  for (const absl::Status& s :
       {concurrency.status(), height.status(), width.status(), steps.status(), text_len.status()}) {
    if (!s.ok()) return fail(s.message());
  }
  if (*concurrency < 1 || *concurrency > 64) return fail("--concurrency: expected 1..64 clients");
  auto requests = args->get_int("--requests", 4 * *concurrency);
  if (!requests.ok() || *requests < 1) return fail("--requests: expected a positive integer");
  const std::string quality = args->get("--quality", "lossless");
  if (quality != "lossless" && quality != "high") {
    return fail(absl::StrCat("--quality ", quality, ": expected lossless or high"));
  }
  server::LoadBenchOptions options;
  options.clients =
      *concurrency == 1 ? std::vector<int>{1} : std::vector<int>{1, static_cast<int>(*concurrency)};
  options.requests = static_cast<int>(*requests);
  options.width = *width;
  options.height = *height;
  options.steps = static_cast<int>(*steps);
  options.quality = quality == "high" ? Quality::kHigh : Quality::kLossless;

  server::ServerOptions server_options;
  server_options.backend_options = *backend_options;
  server_options.enable_quality_high = options.quality == Quality::kHigh;
  server_options.max_sequence_length = static_cast<int>(*text_len);
  server_options.max_response_bytes = int64_t{64} << 20;  // noisy random-weight PNGs are large
  server_options.max_pixels = std::max<int64_t>(server_options.max_pixels, *width * *height);
  const std::string model_dir = args->get("--model-dir", "");
  const std::string model = args->get("--model", "klein-4b");
  const std::string backend_name = args->get("--backend", model_dir.empty() ? "cuda" : "auto");
  server::EngineFactory factory;  // null: the server loads --model-dir as flux2_server does
  if (!model_dir.empty()) {
    server_options.model_dir = model_dir;
    server_options.backend = backend_name;
  } else {
    auto spec = random_pipeline_spec(
        model, args->get("--tokenizer", std::string(model == "dev" ? FLUX2_TINY_DEV_CHECKPOINT_DIR
                                                                   : FLUX2_TINY_CHECKPOINT_DIR) +
                                            "/tokenizer"));
    if (!spec.ok()) return fail(spec.status().message());
    spec->enable_quality_high = server_options.enable_quality_high;
    factory = [=]() -> absl::StatusOr<std::unique_ptr<server::Engine>> {
      absl::StatusOr<std::unique_ptr<Backend>> backend =
          create_backend(backend_name, *backend_options);
      if (!backend.ok()) return backend.status();
      return server::random_pipeline_engine(std::move(*backend), *spec);
    };
  }
  auto phases = server::run_load_bench(server_options, std::move(factory), options);
  if (!phases.ok()) return fail(phases.status().message());
  nlohmann::json result = {{"concurrency", *concurrency},
                           {"model", model_dir.empty() ? model : model_dir},
                           {"quality", quality},
                           {"width", *width},
                           {"height", *height},
                           {"steps", *steps},
                           {"text_len", *text_len},
                           {"requests_per_phase", *requests},
                           {"phases", nlohmann::json::array()}};
  for (const server::LoadBenchPhase& phase : *phases) result["phases"].push_back(phase.to_json());
  const double sequential = phases->front().images_per_second;
  result["throughput_ratio"] = sequential > 0 ? phases->back().images_per_second / sequential : 0.0;
  if (args->has("--json")) {
    std::printf("%s\n", result.dump().c_str());
    return 0;
  }
  for (const server::LoadBenchPhase& phase : *phases) {
    std::printf(
        "%d clients, %d requests of %lldx%lld %s: %.3f images/s, latency p50 %.1f ms, p90 %.1f, "
        "p99 %.1f, max %.1f\n",
        phase.clients, phase.requests, static_cast<long long>(*width),
        static_cast<long long>(*height), quality.c_str(), phase.images_per_second, phase.p50_ms,
        phase.p90_ms, phase.p99_ms, phase.max_ms);
  }
  std::printf("throughput ratio (last phase / one client): %.3f\n",
              result["throughput_ratio"].get<double>());
  return 0;
}

}  // namespace flux2
