// flux2_server as an object (style.md P14): Create(options) validates the configuration, Start()
// binds the gRPC, HTTP API (server/http/http_api.h) and metrics ports and starts the worker (which
// loads the model and warms up before readiness turns SERVING), GracefulStop(deadline) drains.
// Health:
// "", "readiness" and "flux2.v1.ImageGeneration" are SERVING only while the model serves and the
// server is not draining; "liveness" is SERVING while the process is responsive (NOT_SERVING after
// a fatal load error). Reflection: grpc.reflection.v1alpha (Debian's plugin) and v1
// (server/grpc/reflection_v1.h). Tested by tests/server/server_test.cc (fake engine, in process)
// and the end-to-end tests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "prometheus/exposer.h"
#include "server/app/server_options.h"
#include "server/grpc/grpc_service.h"
#include "server/grpc/reflection_v1.h"
#include "server/http/http_api.h"
#include "server/ops/metrics.h"
#include "server/serving/encode_stage.h"
#include "server/serving/engine.h"
#include "server/serving/engine_worker.h"
#include "server/serving/job_queue.h"

namespace flux2::server {

class Server final : public GenerationHost {
 public:
  // Validates `options` and reads the TLS and token files. `factory` creates the engine on the
  // worker thread; nullptr loads the checkpoint the options name
  // (server/serving/pipeline_engine.h).
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options,
                                                        EngineFactory factory = nullptr);
  ~Server() override;  // GracefulStop()s with a zero deadline if still running

  // Binds the ports and starts serving health, metrics and (once the model is loaded and warm)
  // generation. Fails when a port cannot be bound.
  absl::Status Start();
  // The bound ports (useful with port 0).
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }  // 0 when --http-port -1 turned it off

  // Asks WaitForStopRequest to return (signal handler thread).
  void RequestStop();
  // Blocks until RequestStop() (returns OK), or the model failed to load or the device broke
  // (returns that error: the process exits non-zero after the drain).
  absl::Status WaitForStopRequest();
  // Drains: readiness NOT_SERVING and new generation RPCs UNAVAILABLE at once; queued and running
  // jobs finish until `deadline`, then the rest are cancelled (UNAVAILABLE); then gRPC and the
  // metrics endpoint shut down. Returns OK when all admitted work finished in time, and
  // DeadlineExceeded otherwise (the work was cancelled; the process may still exit 0). Idempotent.
  absl::Status GracefulStop(Clock::time_point deadline);
  // False when the worker thread could not be joined (still loading at the deadline).
  bool worker_joined() const { return worker_joined_; }
  // True once the device broke for good (WorkerPhase::kBroken): its state cannot be torn down.
  bool device_broken() const { return device_broken_.load(); }

  // GenerationHost
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving_model() const override;
  absl::Status admit(const std::shared_ptr<Job>& job) override;
  void withdraw(const std::shared_ptr<Job>& job, const absl::Status& reason) override;
  Metrics& metrics() override { return metrics_; }
  const std::string& auth_token() const override { return auth_token_; }
  uint64_t random_seed() override;
  absl::Status liveness() const override;

 private:
  Server(const ServerOptions& options, EngineFactory factory);
  void on_worker_phase(WorkerPhase phase, const absl::Status& status);
  void on_stall(const Stall& stall);
  void on_stall_recovered();
  void set_health(bool ready, bool live);

  const ServerOptions options_;
  EngineFactory factory_;
  std::string auth_token_;
  std::string metrics_user_, metrics_password_;  // --metrics-basic-auth-file
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // guarded by rng_mu_; seeds for requests without one
  std::string tls_cert_pem_, tls_key_pem_;

  Metrics metrics_;
  JobQueue queue_;
  EncodeStage encoder_;
  std::unique_ptr<StallWatchdog> watchdog_;
  std::unique_ptr<EngineWorker> worker_;
  std::unique_ptr<ImageGenerationService> service_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<HttpApi> http_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
  bool worker_joined_ = true;
  std::atomic<bool> device_broken_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<const ServingModel> serving_;  // guarded by mu_; null unless serving
  bool start_called_ = false;                    // guarded by mu_
  bool started_ = false;                         // guarded by mu_: Start() succeeded
  bool draining_ = false;                        // guarded by mu_
  bool stopped_ = false;                         // guarded by mu_
  bool stop_requested_ = false;                  // guarded by mu_
  // guarded by mu_: why the process must exit non-zero (the model failed to load, the device
  // broke), with what the last log line says ("the model failed to load: ...").
  absl::Status fatal_error_;
  bool stalled_ = false;      // guarded by mu_: the watchdog's verdict (liveness NOT_SERVING)
  int outstanding_jobs_ = 0;  // guarded by mu_: admitted, not finished
};

}  // namespace flux2::server
