// flux2_server lifecycle: start, health, admission, drain; see server.h.
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#include "server/app/server.h"

#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "kernels/base/decimal.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "server/common/log.h"
#include "server/serving/pipeline_engine.h"

#ifndef FLUX2_VERSION
#define FLUX2_VERSION "unknown"
#endif

namespace flux2::server {
namespace {

// Guidance range the server accepts (the pipeline rejects values above 100 as well).
constexpr double kMinGuidance = 0.0;
constexpr double kMaxGuidance = 100.0;
// After the drain deadline the running job is cancelled; it stops at its next step boundary,
// which this bounds (a step of FLUX.2-dev at 4 MP takes seconds, not minutes).
constexpr auto kCancelGrace = std::chrono::seconds(60);
// Time gRPC gets to flush the last replies and close the streams once all jobs are done.
constexpr auto kGrpcShutdownGrace = std::chrono::seconds(5);

std::string host_port(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                                       EngineFactory factory) {
  FLUX_RETURN_IF_ERROR(validate_server_options(options));
  if (!options.probe.empty())
    return absl::InvalidArgumentError("--probe: probe mode does not serve");
  if (!factory) {
    factory = [options]() {
      PipelineOptions pipeline;
      pipeline.enable_quality_high = options.enable_quality_high;
      pipeline.text_encoder_residency =
          options.text_encoder_offload ? WeightResidency::kStreamed : WeightResidency::kDevice;
      pipeline.prompt_cache_bytes = options.prompt_cache_bytes;
      pipeline.transformer_file = options.transformer_file;
      pipeline.on_progress = [](const LoadProgress& progress) {
        log_line(LogLevel::kInfo, describe(progress));
      };
      return load_pipeline_engine(options.backend, options.backend_options,
                                  !options.model_dir.empty(), resolved_model_dir(options),
                                  pipeline);
    };
  }
  std::unique_ptr<Server> server(new Server(options, std::move(factory)));
  if (!options.auth_token_file.empty()) {
    FLUX_ASSIGN_OR_RETURN(std::string contents,
                          read_file(options.auth_token_file, "--auth-token-file"));
    const size_t newline = contents.find('\n');
    server->auth_token_ = std::string(absl::StripAsciiWhitespace(contents.substr(0, newline)));
    if (server->auth_token_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file: ", options.auth_token_file, " has an empty first line"));
    }
  }
  if (!options.metrics_basic_auth_file.empty()) {
    FLUX_ASSIGN_OR_RETURN(std::string contents,
                          read_file(options.metrics_basic_auth_file, "--metrics-basic-auth-file"));
    const std::string line =
        std::string(absl::StripAsciiWhitespace(contents.substr(0, contents.find('\n'))));
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics-basic-auth-file: ", options.metrics_basic_auth_file,
                       ": the first line must be user:password"));
    }
    server->metrics_user_ = line.substr(0, colon);
    server->metrics_password_ = line.substr(colon + 1);
  }
  if (!options.tls_cert.empty()) {
    FLUX_ASSIGN_OR_RETURN(server->tls_cert_pem_, read_file(options.tls_cert, "--tls-cert"));
    FLUX_ASSIGN_OR_RETURN(server->tls_key_pem_, read_file(options.tls_key, "--tls-key"));
  }
  return server;
}

Server::Server(const ServerOptions& options, EngineFactory factory)
    : options_(options),
      factory_(std::move(factory)),
      rng_(std::random_device{}()),
      queue_(options.queue_depth, [this](int depth) { metrics_.set_queue_depth(depth); }),
      encoder_(metrics_) {
  WorkerOptions worker_options;
  worker_options.warmup_steps = options.warmup_steps;
  worker_options.test_step_delay_s = options.test_step_delay_s;
  worker_options.fast_paths = options.fast_paths;
  worker_options.max_sequence_length = options.max_sequence_length;
  worker_options.warmup_reference = options.max_reference_images > 0;
  worker_options.test_fault = options.test_fault;
  watchdog_ = std::make_unique<StallWatchdog>(
      options.stall, [this](const Stall& stall) { on_stall(stall); },
      [this] { on_stall_recovered(); });
  worker_ = std::make_unique<EngineWorker>(
      factory_, queue_, encoder_, metrics_, worker_options,
      [this](WorkerPhase phase, const absl::Status& status) { on_worker_phase(phase, status); },
      watchdog_.get());
}

Server::~Server() {
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = started_ && !stopped_;
  }
  if (running) GracefulStop(Clock::now()).IgnoreError();
}

absl::Status Server::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (start_called_) return absl::FailedPreconditionError("Server::Start called twice");
    start_called_ = true;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, which lets a second server bind the same port and silently
  // take half the connections; a port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Requests carry reference images: gRPC refuses larger messages with RESOURCE_EXHAUSTED.
  builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_request_bytes));
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!tls_cert_pem_.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({tls_key_pem_, tls_cert_pem_});
    credentials = grpc::SslServerCredentials(ssl);
  }
  const std::string address = host_port(options_.host, options_.port);
  builder.AddListeningPort(address, credentials, &grpc_port_);
  service_ = std::make_unique<ImageGenerationService>(*this);
  builder.RegisterService(service_.get());
  // Reflection answers from the generated descriptor pool; a generated file is in it only when its
  // object file is linked. Naming the google.rpc types here keeps error_details.proto (BadRequest,
  // RetryInfo, ...) resolvable, so clients can decode grpc-status-details-bin through reflection.
  (void)google::rpc::Status::descriptor();
  (void)google::rpc::BadRequest::descriptor();
  // v1 beside Debian's v1alpha plugin; list_services names what this builder registers.
  reflection_v1_ = std::make_unique<ReflectionV1Service>(
      std::vector<std::string>{flux2::v1::ImageGeneration::service_full_name(),
                               "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                               grpc::reflection::v1::ServerReflection::service_full_name()});
  builder.RegisterService(reflection_v1_.get());
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--port: cannot listen on ", address, " (in use?)"));
  }
  set_health(/*ready=*/false, /*live=*/true);

  const std::string metrics_address = host_port(
      options_.metrics_host.empty() ? options_.host : options_.metrics_host, options_.metrics_port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(metrics_address);
  } catch (const std::exception& e) {
    grpc_server_->Shutdown(std::chrono::system_clock::now());
    return absl::UnavailableError(
        absl::StrCat("--metrics-port: cannot serve metrics on ", metrics_address, ": ", e.what()));
  }
  for (const auto& collectable : metrics_.collectables())
    exposer_->RegisterCollectable(collectable);
  if (!metrics_user_.empty()) {
    exposer_->RegisterAuth(
        [this](const std::string& user, const std::string& password) {
          return constant_time_equal(user, metrics_user_) &&
                 constant_time_equal(password, metrics_password_);
        },
        "flux2 metrics");
  }
  if (!auth_token_.empty() && options_.tls_cert.empty()) {
    log_line(LogLevel::kWarning,
             "--allow-insecure-token: the bearer token travels in plaintext to this server; TLS "
             "must end in front of it");
  }
  const std::vector<int> ports = exposer_->GetListeningPorts();
  metrics_port_ = ports.empty() ? options_.metrics_port : ports.front();
  metrics_.set_ready(false);

  if (options_.http_port >= 0) {
    HttpApiOptions http;
    http.host = options_.host;
    http.port = options_.http_port;
    http.tls_cert_file = options_.tls_cert;
    http.tls_key_file = options_.tls_key;
    http.max_request_bytes = options_.max_request_bytes;
    http.threads = 2 * (options_.queue_depth + 1) + 16;
    http_ = std::make_unique<HttpApi>(*this);
    if (absl::Status status = http_->start(http); !status.ok()) {
      http_.reset();
      exposer_.reset();
      grpc_server_->Shutdown(std::chrono::system_clock::now());
      return status;
    }
    http_port_ = http_->port();
  }

  encoder_.start();
  worker_->start();
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;  // from here on GracefulStop has something to stop
  return absl::OkStatus();
}

void Server::set_health(bool ready, bool live) {
  if (!grpc_server_) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", ready);  // overall: the server can take generation requests
  // The service's own name (what grpc_health_probe -service and generic checkers ask): as "".
  health->SetServingStatus(flux2::v1::ImageGeneration::service_full_name(), ready);
  health->SetServingStatus("readiness", ready);
  health->SetServingStatus("liveness", live);
}

void Server::on_worker_phase(WorkerPhase phase, const absl::Status& status) {
  if (phase == WorkerPhase::kServing) {
    const Engine* engine = worker_->engine();
    auto model = std::make_shared<ServingModel>();
    model->info = engine->info();
    model->engine = engine;
    model->queue_depth = options_.queue_depth;
    RequestLimits& limits = model->limits;
    limits.pixel_multiple = model->info.pixel_multiple;
    limits.max_pixels = options_.max_pixels;
    limits.max_steps = options_.max_steps;
    limits.default_steps = model->info.default_steps;
    limits.min_guidance = kMinGuidance;
    limits.max_guidance = kMaxGuidance;
    limits.max_images = options_.max_images;
    limits.max_prompt_bytes = options_.max_prompt_bytes;
    limits.max_reference_images = options_.max_reference_images;
    limits.max_reference_bytes = options_.max_reference_bytes;
    limits.max_request_bytes = options_.max_request_bytes;
    limits.max_response_bytes = options_.max_response_bytes;
    limits.max_sequence_length = options_.max_sequence_length;
    limits.uses_cfg = model->info.uses_cfg;
    limits.quality_high_enabled = options_.enable_quality_high && model->info.quality_high;
    limits.fast_paths = options_.fast_paths;
    model->backend_options = options_.backend_options;
    model->transformer_file = std::filesystem::path(options_.transformer_file).filename().string();
    model->http_port = http_port_;
    model->stall = options_.stall;
    if (options_.test_fault) model->test_inject_fault = options_.test_fault->flag;
    metrics_.set_build_info(FLUX2_VERSION, model->info.backend, model->info.model_name);
    if (!model->info.device_pci_bus_id.empty() &&
        !metrics_.attach_gpu(model->info.device_pci_bus_id)) {
      log_line(LogLevel::kWarning, absl::StrCat("NVML (libnvidia-ml.so.1) cannot read GPU ",
                                                model->info.device_pci_bus_id,
                                                ": no GPU utilisation, power or clock metrics"));
    }
    // The start-up log names every limit the requests meet (GetModelInfo.limits reports them).
    const std::string limits_line = absl::StrCat(
        "max_pixels=", limits.max_pixels, " max_images=", limits.max_images,
        " max_steps=", limits.max_steps, " max_prompt_bytes=", limits.max_prompt_bytes,
        " max_sequence_length=", limits.max_sequence_length,
        " max_reference_images=", limits.max_reference_images,
        " max_reference_bytes=", limits.max_reference_bytes,
        " max_request_bytes=", limits.max_request_bytes,
        " max_response_bytes=", limits.max_response_bytes, " queue_depth=", options_.queue_depth,
        "; model: variant=", model->info.variant,
        " text_encoder=", model->info.text_encoder_streamed ? "streamed" : "resident",
        " prompt_cache_bytes=", model->info.prompt_cache_bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (draining_) return;
      serving_ = std::move(model);
    }
    set_health(/*ready=*/true, /*live=*/true);
    metrics_.set_ready(true);
    log_line(LogLevel::kInfo, absl::StrCat("ready (limits: ", limits_line, ")"));
  } else if (phase == WorkerPhase::kFailed || phase == WorkerPhase::kBroken) {
    // Liveness NOT_SERVING at once (Kubernetes restarts the pod); new requests get UNAVAILABLE,
    // the worker answers the queued ones so, and the process exits non-zero after the drain.
    if (phase == WorkerPhase::kBroken) device_broken_.store(true);
    set_health(/*ready=*/false, /*live=*/false);
    metrics_.set_ready(false);
    std::lock_guard<std::mutex> lock(mu_);
    serving_ = nullptr;
    fatal_error_ =
        absl::Status(status.code(),
                     absl::StrCat(phase == WorkerPhase::kFailed ? "the model failed to load: "
                                                                : "the GPU failed: ",
                                  absl::StatusCodeToString(status.code()), ": ", status.message()));
    stop_requested_ = true;
    cv_.notify_all();
  }
}

void Server::on_stall(const Stall& stall) {
  metrics_.count_engine_fault(kFaultStall);
  metrics_.set_engine_stalled(true);
  log_line(LogLevel::kError,
           absl::StrCat("request_id=", stall.request_id.empty() ? "-" : stall.request_id,
                        ": the engine is stalled: a stage has run longer than ",
                        exact_decimal(stall.limit_seconds),
                        " s (--stall-timeout-min-s, --stall-step-multiple); liveness NOT_SERVING "
                        "until it ends"));
  std::lock_guard<std::mutex> lock(mu_);
  stalled_ = true;
  if (grpc_server_) set_health(/*ready=*/false, /*live=*/false);
}

void Server::on_stall_recovered() {
  metrics_.set_engine_stalled(false);
  log_line(LogLevel::kWarning, "the stalled stage ended; liveness SERVING again");
  std::lock_guard<std::mutex> lock(mu_);
  stalled_ = false;
  if (grpc_server_ && fatal_error_.ok()) set_health(/*ready=*/serving_ != nullptr, /*live=*/true);
}

absl::StatusOr<std::shared_ptr<const ServingModel>> Server::serving_model() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (serving_) return serving_;
  if (draining_)
    return absl::UnavailableError("the server is shutting down; retry on another replica");
  if (!fatal_error_.ok()) {
    return absl::UnavailableError(
        absl::StrCat(fatal_error_.message(), "; retry on another replica"));
  }
  return absl::UnavailableError("the model is still loading; retry later");
}

absl::Status Server::admit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_)
      return absl::UnavailableError("the server is shutting down; retry on another replica");
    ++outstanding_jobs_;
  }
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

absl::Status Server::liveness() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fatal_error_.ok()) return absl::UnavailableError(fatal_error_.message());
  if (stalled_) {
    return absl::UnavailableError(
        "the engine is stalled: a stage of the running request is far past its expected time");
  }
  return absl::OkStatus();
}

uint64_t Server::random_seed() {
  std::lock_guard<std::mutex> lock(rng_mu_);
  return rng_();
}

void Server::withdraw(const std::shared_ptr<Job>& job, const absl::Status& reason) {
  job->cancel(reason);
  if (queue_.remove(job.get())) job->finish(reason);
}

void Server::RequestStop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;
  cv_.notify_all();
}

absl::Status Server::WaitForStopRequest() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stop_requested_; });
  return fatal_error_;
}

absl::Status Server::GracefulStop(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || !started_) return absl::OkStatus();
    stopped_ = true;
    draining_ = true;
    serving_ = nullptr;
  }
  bool live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live = fatal_error_.ok() && !stalled_;
  }
  set_health(/*ready=*/false, live);
  metrics_.set_ready(false);
  queue_.close();  // queued jobs still run; new ones get UNAVAILABLE
  log_line(LogLevel::kInfo, "draining");

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
  if (http_) http_->stop();  // every generation it answers has finished by now
  service_->wait_for_no_calls(Clock::now() + kGrpcShutdownGrace);
  grpc_server_->Shutdown(std::chrono::system_clock::now());
  exposer_.reset();
  log_line(result.ok() ? LogLevel::kInfo : LogLevel::kWarning,
           result.ok() ? "stopped (drained)" : "stopped (drain timeout)");
  return result;
}

}  // namespace flux2::server
