// flux2_server's composition root: builds and connects the parts; see server.h.
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#include "server/app/server.h"

#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/decimal.h"
#include "kernels/base/read_file.h"
#include "kernels/base/status.h"
#include "server/common/log.h"
#include "server/serving/parallel_engine.h"
#include "server/serving/pipeline_engine.h"

namespace flux2::server {
namespace {

// Time gRPC gets to flush the last replies and close the streams once all jobs are done, and the
// HTTP API to write its last responses.
constexpr auto kFrontEndShutdownGrace = std::chrono::seconds(5);

std::string host_port(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// The first line of `path` (--flag's file), whitespace trimmed.
absl::StatusOr<std::string> first_line(const std::string& path, const char* flag) {
  FLUX_ASSIGN_OR_RETURN(std::string contents, read_file(path, flag));
  return std::string(absl::StripAsciiWhitespace(contents.substr(0, contents.find('\n'))));
}

EngineFactory pipeline_factory(const ServerOptions& options) {
  return [options]() -> absl::StatusOr<std::unique_ptr<Engine>> {
    PipelineOptions pipeline;
    pipeline.enable_quality_high = options.enable_quality_high;
    pipeline.text_encoder_residency =
        options.text_encoder_offload ? WeightResidency::kStreamed : WeightResidency::kDevice;
    pipeline.prompt_cache_bytes = options.prompt_cache_bytes;
    FLUX_RETURN_IF_ERROR(apply_checkpoint_flags(options.checkpoint, pipeline));
    // Without --lora-dir no adapter is ever uploaded: the memory plan holds no LoRA cache.
    pipeline.lora_cache_bytes = options.lora_dir.empty() ? 0 : options.lora_cache_bytes;
    pipeline.on_progress = [](const LoadProgress& progress) {
      log_line(LogLevel::kInfo, describe(progress));
    };
    if (options.gpus.size() > 1) {
      // One engine over N ranks (server/serving/parallel_engine.h); it checks the layout.
      return load_parallel_engine(options.gpus, options.backend, options.backend_options,
                                  !options.model_dir.empty(), resolved_model_dir(options),
                                  pipeline);
    }
    return load_pipeline_engine(options.backend, options.backend_options,
                                !options.model_dir.empty(), resolved_model_dir(options), pipeline);
  };
}

CoreOptions core_options(const ServerOptions& options) {
  CoreOptions core;
  core.queue_depth = options.queue_depth;
  core.limits = limit_flags(options);
  WorkerOptions& worker = core.worker;
  worker.warmup_steps = options.warmup_steps;
  worker.test_step_delay_s = options.test_step_delay_s;
  worker.fast_paths = options.fast_paths;
  worker.max_sequence_length = options.max_sequence_length;
  worker.warmup_reference = options.max_reference_images > 0;
  worker.test_fault = options.test_fault;
  ServingFacts& facts = core.facts;
  facts.backend_options = options.backend_options;
  facts.gpus = options.gpus;
  facts.transformer_file =
      std::filesystem::path(options.checkpoint.transformer_file).filename().string();
  facts.stall = options.stall;
  if (options.test_fault) facts.test_inject_fault = options.test_fault->flag;
  if (!options.lora_dir.empty()) {
    core.lora = {options.lora_dir, options.lora_host_cache_bytes, options.lora_cache_bytes,
                 options.lora_preload};
    facts.lora_options = {{"lora-dir", options.lora_dir},
                          {"lora-cache-bytes", absl::StrCat(options.lora_cache_bytes)},
                          {"lora-host-cache-bytes", absl::StrCat(options.lora_host_cache_bytes)},
                          {"lora-preload", absl::StrJoin(options.lora_preload, ",")}};
  }
  return core;
}

}  // namespace

absl::StatusOr<ServerSecrets> read_server_secrets(const ServerOptions& options) {
  ServerSecrets secrets;
  if (!options.auth_token_file.empty()) {
    FLUX_ASSIGN_OR_RETURN(secrets.auth_token,
                          first_line(options.auth_token_file, "--auth-token-file"));
    if (secrets.auth_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file: ", options.auth_token_file, " has an empty first line"));
    }
  }
  if (!options.metrics_basic_auth_file.empty()) {
    FLUX_ASSIGN_OR_RETURN(const std::string line,
                          first_line(options.metrics_basic_auth_file, "--metrics-basic-auth-file"));
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics-basic-auth-file: ", options.metrics_basic_auth_file,
                       ": the first line must be user:password"));
    }
    secrets.metrics_user = line.substr(0, colon);
    secrets.metrics_password = line.substr(colon + 1);
  }
  if (!options.tls_cert.empty()) {
    FLUX_ASSIGN_OR_RETURN(secrets.tls_cert_pem, read_file(options.tls_cert, "--tls-cert"));
    FLUX_ASSIGN_OR_RETURN(secrets.tls_key_pem, read_file(options.tls_key, "--tls-key"));
  }
  return secrets;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                                       EngineFactory factory) {
  FLUX_RETURN_IF_ERROR(validate_server_options(options));
  if (!options.probe.empty())
    return absl::InvalidArgumentError("--probe: probe mode does not serve");
  FLUX_ASSIGN_OR_RETURN(ServerSecrets secrets, read_server_secrets(options));
  if (!factory) factory = pipeline_factory(options);
  return std::unique_ptr<Server>(new Server(options, std::move(factory), std::move(secrets)));
}

Server::Server(const ServerOptions& options, EngineFactory factory, ServerSecrets secrets)
    : options_(options),
      secrets_(std::move(secrets)),
      core_(
          core_options(options), std::move(factory), metrics_,
          [this](const Health& health) { grpc_.set_health(health); }, [this] { RequestStop(); }),
      grpc_(core_) {}

Server::~Server() {
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = started_ && !stopped_;
  }
  if (running) GracefulStop(Clock::now()).IgnoreError();
}

absl::Status Server::Start() {
  GrpcOptions grpc;
  grpc.address = host_port(options_.host, options_.port);
  grpc.max_request_bytes = options_.max_request_bytes;
  grpc.tls_cert_pem = secrets_.tls_cert_pem;
  grpc.tls_key_pem = secrets_.tls_key_pem;
  grpc.auth_token = secrets_.auth_token;
  FLUX_RETURN_IF_ERROR(grpc_.start(grpc));

  const std::string metrics_address = host_port(
      options_.metrics_host.empty() ? options_.host : options_.metrics_host, options_.metrics_port);
  if (absl::Status status = metrics_endpoint_.start(
          metrics_address, metrics_, secrets_.metrics_user, secrets_.metrics_password);
      !status.ok()) {
    grpc_.stop(Clock::now());
    return status;
  }
  metrics_port_ = metrics_endpoint_.port() != 0 ? metrics_endpoint_.port() : options_.metrics_port;
  if (!secrets_.auth_token.empty() && options_.tls_cert.empty()) {
    log_line(LogLevel::kWarning,
             "--allow-insecure-token: the bearer token travels in plaintext to this server; TLS "
             "must end in front of it");
  }

  if (options_.http_port >= 0) {
    HttpApiOptions http;
    http.host = options_.host;
    http.port = options_.http_port;
    http.tls_cert_pem = secrets_.tls_cert_pem;
    http.tls_key_pem = secrets_.tls_key_pem;
    http.max_request_bytes = options_.max_request_bytes;
    http.head_timeout_s = options_.http_head_timeout_s;
    http.body_timeout_s = options_.http_body_timeout_s;
    http.idle_timeout_s = options_.http_idle_timeout_s;
    http.max_connections = options_.http_max_connections;
    http.max_connections_per_client = options_.http_max_connections_per_client;
    http_ = std::make_unique<HttpApi>(core_, secrets_.auth_token);
    if (absl::Status status = http_->start(http); !status.ok()) {
      http_.reset();
      metrics_endpoint_.stop();
      grpc_.stop(Clock::now());
      return status;
    }
    http_port_ = http_->port();
  }
  std::map<std::string, std::string> http_options;
  if (http_) {
    http_options = {{"http-head-timeout-s", exact_decimal(options_.http_head_timeout_s)},
                    {"http-body-timeout-s", exact_decimal(options_.http_body_timeout_s)},
                    {"http-idle-timeout-s", exact_decimal(options_.http_idle_timeout_s)},
                    {"http-max-connections", absl::StrCat(options_.http_max_connections)},
                    {"http-max-connections-per-client",
                     absl::StrCat(options_.http_max_connections_per_client)}};
  }
  core_.set_http_facts(http_port_, std::move(http_options));
  core_.start();
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;  // from here on GracefulStop has something to stop
  return absl::OkStatus();
}

void Server::RequestStop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;
  cv_.notify_all();
}

absl::Status Server::WaitForStopRequest() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stop_requested_; });
  return core_.state().fatal_error();
}

absl::Status Server::GracefulStop(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || !started_) return absl::OkStatus();
    stopped_ = true;
  }
  log_line(LogLevel::kInfo, "draining");
  const absl::Status result = core_.drain(deadline);
  // Every generation the front ends answer has finished by now; they write the last answers.
  if (http_) http_->stop(Clock::now() + kFrontEndShutdownGrace);
  grpc_.stop(Clock::now() + kFrontEndShutdownGrace);
  metrics_endpoint_.stop();
  log_line(result.ok() ? LogLevel::kInfo : LogLevel::kWarning,
           result.ok() ? "stopped (drained)" : "stopped (drain timeout)");
  return result;
}

}  // namespace flux2::server
