// `flux2 bench --concurrency`'s load generator; see load_bench.h. Tested by
// tests/server/load_bench_test.cc.
#include "server/cli/bench/load_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "flux2/v1/image_generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/base/status.h"
#include "server/app/server.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

v1::GenerateImageRequest bench_request(const LoadBenchOptions& options, int phase, int index) {
  v1::GenerateImageRequest request;
  // Distinct prompts: each request encodes its own, as independent users' requests do.
  request.set_prompt(
      absl::StrCat("A photo of a red fox in fresh snow at golden hour, watercolor "
                   "style, highly detailed, variation ",
                   phase, "-", index));
  request.set_width(static_cast<int32_t>(options.width));
  request.set_height(static_cast<int32_t>(options.height));
  if (options.steps > 0) request.set_num_inference_steps(options.steps);
  request.set_seed(static_cast<uint64_t>(1000 * phase + index));
  request.set_quality(options.quality == Quality::kHigh ? v1::QUALITY_HIGH : v1::QUALITY_LOSSLESS);
  return request;
}

// Waits until the server serves (OK), or its model failed to load (that error).
absl::Status wait_until_serving(Server& server) {
  while (true) {
    absl::StatusOr<std::shared_ptr<const ServingModel>> model = server.core().serving_model();
    if (model.ok()) return absl::OkStatus();
    if (absl::Status live = server.core().state().health().live; !live.ok()) return model.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The difference of the server's collective totals from `before` to now, by gpu.
std::map<int, Metrics::StepCollectiveTotals> collectives_since(
    const Metrics& metrics, const std::map<int, Metrics::StepCollectiveTotals>& before) {
  std::map<int, Metrics::StepCollectiveTotals> phase = metrics.step_collective_totals();
  for (auto& [gpu, total] : phase) {
    const auto it = before.find(gpu);
    if (it == before.end()) continue;
    total.steps -= it->second.steps;
    total.seconds.all_to_all -= it->second.seconds.all_to_all;
    total.seconds.all_gather -= it->second.seconds.all_gather;
  }
  return phase;
}

absl::StatusOr<LoadBenchPhase> run_phase(v1::ImageGeneration::Stub& stub, const Metrics& metrics,
                                         const LoadBenchOptions& options, int phase, int clients) {
  const std::map<int, Metrics::StepCollectiveTotals> before = metrics.step_collective_totals();
  LoadBenchPhase result;
  result.clients = clients;
  result.requests = options.requests;
  std::atomic<int> next{0};
  std::mutex mu;
  std::vector<double> latencies;  // guarded by mu
  std::string first_error;        // guarded by mu
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < options.requests;) {
        const v1::GenerateImageRequest request = bench_request(options, phase, i);
        grpc::ClientContext context;
        v1::GenerateImageResponse response;
        const Clock::time_point sent = Clock::now();
        const grpc::Status status = stub.GenerateImage(&context, request, &response);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
        std::lock_guard<std::mutex> lock(mu);
        const std::string code = status.ok() ? "OK" : absl::StrCat(status.error_code());
        ++result.codes[code];
        if (status.ok()) {
          latencies.push_back(ms);
          result.images += response.images_size();
        } else if (first_error.empty()) {
          first_error = absl::StrCat("request ", i, ": code ", code, ": ", status.error_message());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!first_error.empty()) {
    return absl::InternalError(absl::StrCat(clients, " clients: ", first_error));
  }
  std::sort(latencies.begin(), latencies.end());
  result.images_per_second = result.images / result.wall_seconds;
  result.p50_ms = percentile(latencies, 0.50);
  result.p90_ms = percentile(latencies, 0.90);
  result.p99_ms = percentile(latencies, 0.99);
  result.max_ms = latencies.empty() ? 0.0 : latencies.back();
  double sum = 0.0;
  for (double ms : latencies) sum += ms;
  result.mean_ms = latencies.empty() ? 0.0 : sum / static_cast<double>(latencies.size());
  result.collectives = collectives_since(metrics, before);
  return result;
}

}  // namespace

nlohmann::json LoadBenchPhase::to_json() const {
  nlohmann::json out{{"clients", clients},
                     {"requests", requests},
                     {"codes", codes},
                     {"images", images},
                     {"wall_seconds", wall_seconds},
                     {"images_per_second", images_per_second},
                     {"latency_ms_p50", p50_ms},
                     {"latency_ms_p90", p90_ms},
                     {"latency_ms_p99", p99_ms},
                     {"latency_ms_mean", mean_ms},
                     {"latency_ms_max", max_ms}};
  if (collectives.empty()) return out;
  nlohmann::json& per_gpu = out["collective_ms_per_step"] = nlohmann::json::object();
  for (const auto& [gpu, total] : collectives) {
    const double steps = static_cast<double>(std::max<uint64_t>(total.steps, 1));
    per_gpu[std::to_string(gpu)] = {{"all_to_all", 1e3 * total.seconds.all_to_all / steps},
                                    {"all_gather", 1e3 * total.seconds.all_gather / steps},
                                    {"steps", total.steps}};
  }
  return out;
}

absl::StatusOr<std::vector<LoadBenchPhase>> run_load_bench(ServerOptions server_options,
                                                           EngineFactory factory,
                                                           const LoadBenchOptions& options) {
  if (options.requests < 1) return absl::InvalidArgumentError("--requests: at least 1");
  int most_clients = 1;
  for (int clients : options.clients) {
    if (clients < 1) return absl::InvalidArgumentError("--concurrency: at least 1 client");
    most_clients = std::max(most_clients, clients);
  }
  server_options.host = "127.0.0.1";
  server_options.port = 0;
  server_options.metrics_port = 0;
  server_options.metrics_host = "127.0.0.1";
  server_options.http_port = -1;
  server_options.queue_depth = std::max(server_options.queue_depth, most_clients);
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Server> server,
                        Server::Create(server_options, std::move(factory)));
  FLUX_RETURN_IF_ERROR(server->Start());
  absl::Status status = wait_until_serving(*server);
  std::vector<LoadBenchPhase> phases;
  if (status.ok()) {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(static_cast<int>(server_options.max_response_bytes));
    auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server->grpc_port()),
                                             grpc::InsecureChannelCredentials(), arguments);
    auto stub = v1::ImageGeneration::NewStub(channel);
    // One request at the bench size first: plans and allocations at this shape are in place.
    LoadBenchOptions warm_up_options = options;
    warm_up_options.requests = 1;
    const Metrics& metrics = server->core().metrics();
    absl::StatusOr<LoadBenchPhase> warm_up = run_phase(*stub, metrics, warm_up_options, 0, 1);
    status = warm_up.status();
    for (size_t p = 0; status.ok() && p < options.clients.size(); ++p) {
      absl::StatusOr<LoadBenchPhase> phase =
          run_phase(*stub, metrics, options, static_cast<int>(p) + 1, options.clients[p]);
      status = phase.status();
      if (phase.ok()) phases.push_back(*phase);
    }
  }
  server->RequestStop();
  const absl::Status stopped = server->GracefulStop(Clock::now() + std::chrono::seconds(30));
  if (!status.ok()) return status;
  FLUX_RETURN_IF_ERROR(stopped);
  return phases;
}

}  // namespace flux2::server
