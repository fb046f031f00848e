// The serving core: admission, the model's publication, the drain; see serving_core.h.
// Tested by tests/server/server_test.cc and drain_test.cc (fake engine).
#include "server/serving/serving_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/decimal.h"
#include "kernels/base/status.h"
#include "model/flux2_lora.h"
#include "server/common/log.h"
#include "server/serving/validate.h"

namespace flux2::server {
namespace {

// After the drain deadline the running job is cancelled; it stops at its next step boundary,
// which this bounds (a step of FLUX.2-dev at 4 MP takes seconds, not minutes).
constexpr auto kCancelGrace = std::chrono::seconds(60);

// The `ready` log line: every limit the requests meet (GetModelInfo.limits reports the same).
std::string ready_line(const ServingModel& model) {
  std::string line = "ready (limits:";
  for (const LimitEntry& entry : limit_entries(model.limits)) {
    absl::StrAppend(&line, " ", entry.name, "=", exact_decimal(entry.value));
  }
  absl::StrAppend(&line, " queue_depth=", model.facts.queue_depth,
                  "; model: variant=", model.info.variant,
                  " text_encoder=", model.info.text_encoder_streamed ? "streamed" : "resident",
                  " prompt_cache_bytes=", model.info.prompt_cache_bytes, ")");
  return line;
}

}  // namespace

ServingCore::ServingCore(CoreOptions options, EngineFactory factory, Metrics& metrics,
                         std::function<void(const Health&)> on_health,
                         std::function<void()> on_fatal)
    : options_(std::move(options)),
      metrics_(metrics),
      on_fatal_(std::move(on_fatal)),
      state_(std::move(on_health)),
      rng_(std::random_device{}()),
      queue_(options_.queue_depth, [this](int depth) { metrics_.set_queue_depth(depth); }),
      encoder_(metrics_) {
  options_.facts.queue_depth = options_.queue_depth;
  watchdog_ = std::make_unique<StallWatchdog>(
      options_.facts.stall, [this](const Stall& stall) { on_stall(stall); },
      [this] { on_stall_recovered(); });
  worker_ = std::make_unique<EngineWorker>(
      std::move(factory), queue_, encoder_, metrics_, options_.worker,
      [this](WorkerPhase phase, const absl::Status& status) { on_worker_phase(phase, status); },
      watchdog_.get());
}

ServingCore::~ServingCore() {
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = started_ && !drained_;
  }
  if (running) drain(Clock::now()).IgnoreError();
}

void ServingCore::start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
  }
  metrics_.set_ready(false);
  encoder_.start();
  worker_->start();
}

void ServingCore::on_worker_phase(WorkerPhase phase, const absl::Status& status) {
  if (phase == WorkerPhase::kServing) {
    publish_model();
    return;
  }
  if (phase != WorkerPhase::kFailed && phase != WorkerPhase::kBroken) return;
  // Liveness NOT_SERVING at once (Kubernetes restarts the pod); new requests get UNAVAILABLE,
  // the worker answers the queued ones so, and the process exits non-zero after the drain.
  if (phase == WorkerPhase::kBroken) device_broken_.store(true);
  metrics_.set_ready(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = nullptr;
  }
  state_.set_failed(
      absl::Status(status.code(),
                   absl::StrCat(phase == WorkerPhase::kFailed ? "the model failed to load: "
                                                              : "the GPU failed: ",
                                absl::StatusCodeToString(status.code()), ": ", status.message())));
  if (on_fatal_) on_fatal_();
}

void ServingCore::publish_model() {
  const Engine* engine = worker_->engine();
  auto model = std::make_shared<ServingModel>();
  model->info = engine->info();
  model->engine = engine;
  model->facts = options_.facts;
  absl::StatusOr<Limits> limits = resolve_limits(options_.limits, model->info);
  if (!limits.ok()) {
    // A flag beyond the loaded model's bound: the server cannot serve what it advertises.
    on_worker_phase(WorkerPhase::kFailed, limits.status());
    return;
  }
  model->limits = *limits;
  if (absl::Status lora = open_loras(*engine); !lora.ok()) {
    on_worker_phase(WorkerPhase::kFailed, lora);
    return;
  }
  model->loras = loras_.get();
  metrics_.set_build_info(FLUX2_VERSION, model->info.backend, model->info.model_name);
  const std::vector<std::string> bus_ids = engine->device_pci_bus_ids();  // one per rank
  const std::vector<int> gpus = engine->device_ordinals();
  for (size_t r = 0; r < bus_ids.size() && r < gpus.size(); ++r) {
    if (!bus_ids[r].empty() && !metrics_.attach_gpu(bus_ids[r], gpus[r])) {
      log_line(LogLevel::kWarning,
               absl::StrCat("NVML (libnvidia-ml.so.1) cannot read GPU ", gpus[r], " (", bus_ids[r],
                            "): no GPU utilisation, power or clock metrics for it"));
    }
  }
  const std::string line = ready_line(*model);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drained_ || state_.phase() != ServerPhase::kLoading) return;
    serving_ = std::move(model);
  }
  state_.set_serving();
  metrics_.set_ready(true);
  log_line(LogLevel::kInfo, line);
}

absl::Status ServingCore::open_loras(const Engine& engine) {
  const LoraServingOptions& lora = options_.lora;
  if (lora.dir.empty()) return absl::OkStatus();
  const Flux2Config* config = engine.lora_config();
  if (config == nullptr) {
    return absl::UnimplementedError("--lora-dir: this engine takes no LoRA adapters");
  }
  LoraRegistryOptions registry;
  registry.dir = lora.dir;
  registry.host_cache_bytes = lora.host_cache_bytes;
  registry.max_rank = options_.limits.max_lora_rank;
  registry.max_scale = options_.limits.max_lora_scale;
  registry.make_host_image = engine.lora_host_image_maker();
  FLUX_ASSIGN_OR_RETURN(loras_, LoraRegistry::open(registry, *config, &metrics_));
  for (const std::string& name : lora.preload) {
    absl::StatusOr<ResolvedLora> resolved = loras_->resolve(name);
    absl::Status status = resolved.status();
    if (status.ok())
      status =
          engine.pin_lora(LoraRequest{resolved->sha256, resolved->adapter, 1.0, resolved->image});
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("--lora-preload: ", name, ": ", status.message()));
    }
    loras_->mark_pinned(name);
    pinned_lora_bytes_[resolved->sha256] =
        Flux2LoraWeights::device_bytes(*resolved->adapter, engine.info().weight_value_bytes);
    log_line(LogLevel::kInfo, absl::StrCat("LoRA adapter ", name, " pinned on the device"));
  }
  update_lora_device_metrics_from(engine);
  return absl::OkStatus();
}

absl::Status ServingCore::resolve_loras(const GenerateRequest& request, const ServingModel& model,
                                        JobSpec& spec) {
  if (request.loras.empty() || model.loras == nullptr) return absl::OkStatus();
  std::vector<FieldViolation> violations;
  int64_t device_bytes = 0;
  for (size_t i = 0; i < request.loras.size(); ++i) {
    const LoraSpec& wanted = request.loras[i];
    const std::string field = absl::StrCat("loras[", i, "]");
    absl::StatusOr<ResolvedLora> lora = model.loras->resolve(wanted.name);
    if (absl::IsNotFound(lora.status()) || absl::IsPermissionDenied(lora.status())) {
      violations.push_back({field + ".name", std::string(lora.status().message())});
      continue;
    }
    if (!lora.ok()) {
      violations.push_back({field, absl::StrCat(wanted.name, ": ", lora.status().message())});
      continue;
    }
    const double scale = wanted.scale.value_or(1.0);
    device_bytes += Flux2LoraWeights::device_bytes(*lora->adapter, model.info.weight_value_bytes);
    spec.params.loras.push_back(LoraRequest{lora->sha256, lora->adapter, scale, lora->image});
    spec.loras.push_back(AppliedLora{wanted.name, scale, lora_layout_name(lora->adapter->layout),
                                     lora->adapter->max_rank(), lora->sha256.substr(0, 12)});
  }
  if (!violations.empty()) return invalid_argument_status(violations);
  return check_lora_budget(spec, device_bytes);
}

absl::Status ServingCore::check_lora_budget(const JobSpec& spec, int64_t device_bytes) {
  const int64_t capacity = options_.lora.device_cache_bytes;
  if (capacity <= 0) return absl::OkStatus();  // no cache: each request uploads for itself
  // The device cache never evicts pinned adapters: those the request does not name stay beside it
  // (the worker's LoraDeviceCache::acquire would refuse it, after queueing, as an engine fault).
  int64_t pinned_bytes = 0;
  for (const auto& pinned : pinned_lora_bytes_) {  // not a structured binding: clang 14's lambdas
    const bool named = std::any_of(spec.params.loras.begin(), spec.params.loras.end(),
                                   [&](const LoraRequest& r) { return r.key == pinned.first; });
    if (!named) pinned_bytes += pinned.second;
  }
  if (device_bytes + pinned_bytes <= capacity) return absl::OkStatus();
  metrics_.count_resource_exhausted(kLoraCacheFull);
  if (pinned_bytes == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "loras: ", device_bytes, " bytes of adapters exceed --lora-cache-bytes ", capacity));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("loras: ", device_bytes, " bytes of adapters do not fit --lora-cache-bytes ",
                   capacity, " beside the ", pinned_bytes, " bytes of --lora-preload's adapters"));
}

void ServingCore::update_lora_device_metrics() {
  absl::StatusOr<std::shared_ptr<const ServingModel>> model = serving_model();
  if (model.ok() && (*model)->loras != nullptr) update_lora_device_metrics_from(*(*model)->engine);
}

void ServingCore::update_lora_device_metrics_from(const Engine& engine) {
  const std::optional<LoraCacheStats> now = engine.lora_cache_stats();
  if (!now) return;
  std::lock_guard<std::mutex> lock(lora_mu_);
  LoraCacheStats& seen = lora_device_seen_;
  LoraMetrics& lora = metrics_.lora();
  lora.count_cache("device", true, now->hits - seen.hits);
  lora.count_cache("device", false, now->misses - seen.misses);
  lora.count_evictions("device", now->evictions - seen.evictions);
  if (now->upload_seconds > seen.upload_seconds) {
    lora.observe_upload(now->upload_seconds - seen.upload_seconds);
  }
  lora.set_cache("device", now->bytes, now->capacity);
  seen = *now;
}

void ServingCore::on_stall(const Stall& stall) {
  metrics_.count_engine_fault(kFaultStall);
  metrics_.set_engine_stalled(true);
  log_line(LogLevel::kError,
           absl::StrCat("request_id=", stall.request_id.empty() ? "-" : stall.request_id,
                        ": the engine is stalled: a stage has run longer than ",
                        exact_decimal(stall.limit_seconds),
                        " s (--stall-timeout-min-s, --stall-step-multiple); liveness NOT_SERVING "
                        "until it ends"));
  state_.set_stalled(true);
}

void ServingCore::on_stall_recovered() {
  metrics_.set_engine_stalled(false);
  log_line(LogLevel::kWarning, "the stalled stage ended; liveness SERVING again");
  state_.set_stalled(false);
}

absl::StatusOr<std::shared_ptr<const ServingModel>> ServingCore::serving_model() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (serving_) return serving_;
  }
  absl::Status ready = state_.health().ready;
  if (ready.ok()) ready = absl::UnavailableError("the model is still loading; retry later");
  return ready;
}

uint64_t ServingCore::random_seed() {
  std::lock_guard<std::mutex> lock(rng_mu_);
  return rng_();
}

absl::StatusOr<std::shared_ptr<Job>> ServingCore::create_job(
    const GenerateRequest& request, Clock::time_point arrival, Clock::time_point deadline,
    std::shared_ptr<JobEvents> events, std::shared_ptr<const ServingModel>* model) {
  FLUX_ASSIGN_OR_RETURN(*model, serving_model());
  FLUX_ASSIGN_OR_RETURN(JobSpec spec, validate(request, (*model)->limits, random_seed()));
  FLUX_RETURN_IF_ERROR(resolve_loras(request, **model, spec));
  const std::vector<FieldViolation> refused = (*model)->engine->check(spec.params);
  if (!refused.empty()) return invalid_argument_status(refused);
  metrics_.lora().count_request(static_cast<int64_t>(spec.params.loras.size()));
  return std::make_shared<Job>(std::move(spec), arrival, deadline, std::move(events));
}

absl::Status ServingCore::admit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drained_ || state_.phase() == ServerPhase::kDraining) {
      return absl::UnavailableError("the server is shutting down; retry on another replica");
    }
    ++outstanding_jobs_;
  }
  // The device cache's hits and uploads are counted before the client sees the response.
  if (!job->spec().params.loras.empty())
    job->set_before_done([this] { update_lora_device_metrics(); });
  job->set_on_finished([this] {
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_jobs_;
    cv_.notify_all();
  });
  absl::Status status = queue_.push(job);
  if (absl::IsResourceExhausted(status)) metrics_.count_resource_exhausted(kQueueFull);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    --outstanding_jobs_;
    cv_.notify_all();
  }
  return status;
}

void ServingCore::withdraw(const std::shared_ptr<Job>& job, const absl::Status& reason) {
  job->cancel(reason);
  if (queue_.remove(job.get())) job->finish(reason);
}

absl::Status ServingCore::drain(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drained_ || !started_) return absl::OkStatus();
    drained_ = true;
    serving_ = nullptr;
  }
  state_.set_draining();
  metrics_.set_ready(false);
  queue_.close();  // queued jobs still run; new ones get UNAVAILABLE
  absl::Status result = absl::OkStatus();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [this] { return outstanding_jobs_ == 0; })) {
      result = absl::DeadlineExceededError(
          absl::StrCat(outstanding_jobs_, " requests were still running at the drain deadline"));
    }
  }
  if (!result.ok()) {
    const absl::Status reason =
        absl::UnavailableError("the server is shutting down and the drain timeout passed");
    for (const std::shared_ptr<Job>& job : queue_.take_all()) job->finish(reason);
    worker_->cancel_running(reason);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kCancelGrace, [this] { return outstanding_jobs_ == 0; });
  }
  // A worker still loading the model cannot be interrupted; the caller exits without it.
  const bool loading = worker_->phase() == WorkerPhase::kLoading;
  worker_joined_ =
      worker_->join_until(Clock::now() + (loading ? std::chrono::seconds(0) : kCancelGrace));
  encoder_.stop();
  state_.set_stopped();
  return result;
}

}  // namespace flux2::server
