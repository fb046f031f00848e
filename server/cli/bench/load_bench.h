// Throughput under concurrent load through the whole server path (`flux2 bench --concurrency N`):
// an in-process Server (gRPC on 127.0.0.1, ephemeral ports, the admission queue, the
// engine worker, PNG encoding) over an engine factory; for each client count in turn, that many
// threads send unary GenerateImage requests back to back (distinct prompts and seeds, so neither
// the prompt cache nor anything else is shared) until the phase's requests are sent. Reports
// what the clients saw: images/s over the phase's wall time and latency percentiles, and with
// several GPUs each GPU's collective time per step from the server's metrics. Tested by
// tests/server/load_bench_test.cc (fake engine) and `flux2 bench --concurrency` on the tiny
// checkpoint (tests/server/CMakeLists.txt); run on the GPU by tests/gpu/run_on_device.sh.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/app/server_options.h"
#include "server/ops/metrics.h"
#include "server/serving/engine.h"

namespace flux2::server {

struct LoadBenchOptions {
  std::vector<int> clients = {1, 8};  // one phase per entry, in order (1: the sequential baseline)
  int requests = 32;                  // per phase
  int64_t width = 1024, height = 1024;
  int steps = 0;  // num_inference_steps; 0: the model's default
  Quality quality = Quality::kLossless;
};

struct LoadBenchPhase {
  int clients = 0;
  int requests = 0;
  std::map<std::string, int> codes;  // gRPC status code name -> count
  int images = 0;                    // images returned (OK requests)
  double wall_seconds = 0.0;         // first request sent -> last answer
  double images_per_second = 0.0;
  // Request latency as the client saw it (send -> response), OK requests, milliseconds.
  double p50_ms = 0.0, p90_ms = 0.0, p99_ms = 0.0, mean_ms = 0.0, max_ms = 0.0;
  // An engine over several GPUs (--gpus): each GPU's steps in this phase and its collectives'
  // seconds in them (flux2_denoise_step_collective_seconds), by device ordinal; empty otherwise.
  std::map<int, Metrics::StepCollectiveTotals> collectives;
  // JSON; with `collectives`, "collective_ms_per_step": {"<gpu>": {"all_to_all", "all_gather",
  // "steps"}} (milliseconds per step, the mean over the phase's steps).
  nlohmann::json to_json() const;
};

// Starts a Server with `server_options` (ports and host overridden: 127.0.0.1, ephemeral, HTTP
// off; the queue deep enough for every client) over `factory`, waits until it serves, sends one
// warm-up request at the bench size, runs the phases and stops the server. A phase fails (the
// error) when any request does not return OK.
absl::StatusOr<std::vector<LoadBenchPhase>> run_load_bench(ServerOptions server_options,
                                                           EngineFactory factory,
                                                           const LoadBenchOptions& options);

}  // namespace flux2::server
