// The transport-free serving core both front ends drive: the served model and its limits, request
// validation, the bounded admission queue, the engine worker (which loads the model), the encode
// stage, the stall watchdog, the server state, and the drain. A front end turns its wire request
// into a GenerateRequest, calls create_job (validation), admit, and withdraw when its client
// leaves, and drains the job's events (server/serving/job_events.h). No gRPC, protobuf or HTTP
// here. Tested by tests/server/server_test.cc, http_api_test.cc and drain_test.cc (fake engine).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend_options.h"
#include "server/ops/metrics.h"
#include "server/serving/encode_stage.h"
#include "server/serving/engine.h"
#include "server/serving/engine_worker.h"
#include "server/serving/job_events.h"
#include "server/serving/job_queue.h"
#include "server/serving/limits.h"
#include "server/serving/lora_registry.h"
#include "server/serving/request.h"
#include "server/serving/server_state.h"
#include "server/serving/stall_watchdog.h"

namespace flux2::server {

// What GetModelInfo reports besides the model: the flags that steer serving.
struct ServingFacts {
  int queue_depth = 8;
  BackendOptions backend_options;  // as the flags set them
  std::vector<int> gpus = {0};     // --gpus: device ordinals one request is split over
  std::string transformer_file;    // --transformer-file's file name (no directory); "" when none
  int http_port = 0;               // the bound HTTP API port; 0 when it is off
  // The HTTP API's connection flags by name (http-head-timeout-s, ...); empty when it is off.
  std::map<std::string, std::string> http_options;
  // The LoRA flags by name (lora-dir, lora-cache-bytes, lora-host-cache-bytes, lora-preload);
  // empty without --lora-dir.
  std::map<std::string, std::string> lora_options;
  StallPolicy stall;              // --stall-timeout-min-s, --stall-step-multiple
  std::string test_inject_fault;  // TEST ONLY: --test-inject-fault as given; "" in production
};

// The model being served, as the front ends see it (immutable once published).
struct ServingModel {
  PipelineInfo info;
  Limits limits;
  ServingFacts facts;
  const Engine* engine = nullptr;  // for Engine::check (thread-safe); outlives the requests
  LoraRegistry* loras = nullptr;   // the adapters under --lora-dir; null without it
};

// Where adapters come from and how many stay cached (--lora-*; README "LoRA adapters").
struct LoraServingOptions {
  std::string dir;  // --lora-dir; empty: LoRA is off
  int64_t host_cache_bytes = int64_t{8} << 30;
  int64_t device_cache_bytes = int64_t{2} << 30;  // --lora-cache-bytes (the engine's budget)
  std::vector<std::string> preload;  // --lora-preload: loaded and pinned before readiness
};

struct CoreOptions {
  int queue_depth = 8;   // requests that may wait behind the running one
  LimitFlags limits;     // narrowed into the model's bounds when it loads (resolve_limits)
  WorkerOptions worker;  // warm-up, test delays and faults
  ServingFacts facts;    // reported as they are (queue_depth is copied in)
  LoraServingOptions lora;
};

class ServingCore {
 public:
  // `factory` creates the engine on the worker thread. `on_health` runs after every change of
  // the server's health (ServerState's on_change); `on_fatal` once when the model failed to load
  // or the device broke (the process should drain and exit non-zero).
  ServingCore(CoreOptions options, EngineFactory factory, Metrics& metrics,
              std::function<void(const Health&)> on_health, std::function<void()> on_fatal);
  ~ServingCore();  // drains with a zero deadline if still running

  // Starts the encoder and the worker (which loads the model, warms up, then serves).
  void start();
  // The HTTP API's port and flags GetModelInfo reports; set before start().
  void set_http_facts(int port, std::map<std::string, std::string> http_options) {
    options_.facts.http_port = port;
    options_.facts.http_options = std::move(http_options);
  }

  const ServerState& state() const { return state_; }
  Metrics& metrics() { return metrics_; }

  // The model, or Unavailable (saying why) while loading, draining or after a failure.
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving_model() const;
  // Validates `request` against the served limits, then the engine's own checks, and creates its
  // job (not yet admitted) whose events go to `events`. `deadline`: Clock::time_point::max() for
  // none. `model` receives the model it was validated against.
  absl::StatusOr<std::shared_ptr<Job>> create_job(const GenerateRequest& request,
                                                  Clock::time_point arrival,
                                                  Clock::time_point deadline,
                                                  std::shared_ptr<JobEvents> events,
                                                  std::shared_ptr<const ServingModel>* model);
  // Admits a job: ResourceExhausted when the queue is full, Unavailable when draining.
  absl::Status admit(const std::shared_ptr<Job>& job);
  // The client left or its deadline passed: cancels the job, and finishes it at once with
  // `reason` when it still waits in the queue.
  void withdraw(const std::shared_ptr<Job>& job, const absl::Status& reason);

  // Readiness off and new jobs refused at once; queued and running jobs finish until `deadline`,
  // then the rest are cancelled (UNAVAILABLE); then the worker and the encoder stop. OK when all
  // admitted work finished in time, DeadlineExceeded otherwise. Idempotent.
  absl::Status drain(Clock::time_point deadline);
  // False when the worker could not be joined (still loading at the deadline).
  bool worker_joined() const { return worker_joined_; }
  // True once the device broke for good (WorkerPhase::kBroken): its state cannot be torn down.
  bool device_broken() const { return device_broken_.load(); }

 private:
  void on_worker_phase(WorkerPhase phase, const absl::Status& status);
  void publish_model();
  // Opens --lora-dir for `engine`'s transformer and loads and pins --lora-preload's adapters.
  absl::Status open_loras(const Engine& engine);
  // Resolves the request's adapters through the registry into spec's params and report.
  absl::Status resolve_loras(const GenerateRequest& request, const ServingModel& model,
                             JobSpec& spec);
  // ResourceExhausted when a request's `device_bytes` of adapters do not fit --lora-cache-bytes
  // beside the pinned adapters it does not name (counted as lora_cache).
  absl::Status check_lora_budget(const JobSpec& spec, int64_t device_bytes);
  // flux2_lora_* of the device tier from the engine's cache counters (after each request).
  void update_lora_device_metrics();
  void update_lora_device_metrics_from(const Engine& engine);
  void on_stall(const Stall& stall);
  void on_stall_recovered();
  uint64_t random_seed();

  CoreOptions options_;
  Metrics& metrics_;
  std::function<void()> on_fatal_;
  ServerState state_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // guarded by rng_mu_; seeds for requests without one
  JobQueue queue_;
  EncodeStage encoder_;
  std::unique_ptr<StallWatchdog> watchdog_;
  std::unique_ptr<EngineWorker> worker_;
  std::unique_ptr<LoraRegistry> loras_;  // set once, on the worker thread, before serving
  // --lora-preload's adapters (sha256, the device cache's key -> device bytes), never evicted from
  // the device cache: a request's others must fit beside them (set with loras_).
  std::map<std::string, int64_t> pinned_lora_bytes_;
  std::mutex lora_mu_;
  LoraCacheStats lora_device_seen_;  // guarded by lora_mu_: the counters last exported
  bool worker_joined_ = true;
  std::atomic<bool> device_broken_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<const ServingModel> serving_;  // guarded by mu_; null unless serving
  bool started_ = false;                         // guarded by mu_
  bool drained_ = false;                         // guarded by mu_
  int outstanding_jobs_ = 0;                     // guarded by mu_: admitted, not finished
};

}  // namespace flux2::server
