// The OpenAI-compatible HTTP API on the HTTP/1.1 transport; see http_api.h.
// Tested by tests/server/http_api_test.cc, http_hostile_test.py and openai_client_test.mjs.
#include "server/http/http_api.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "model/json_util.h"
#include "server/common/bearer_token.h"
#include "server/http/form_data.h"
#include "server/http/openai_images.h"
#include "server/http/openai_loras.h"
#include "server/serving/access_log.h"
#include "server/serving/field_violations.h"

namespace flux2::server {

// The OpenAPI 3 document served at /openapi.json (server/http/openapi.json, embedded at build
// time).
extern const char kOpenApiDocument[];

namespace {

using nlohmann::json;

// A route: its path, the one method it takes, the label its requests are counted under in
// flux2_requests_total{method}, and whether it needs the bearer token. Refusals on paths that
// are no route are counted under kUnroutedMethod.
struct Route {
  const char* path;
  const char* method;
  const char* label;
  bool needs_token;
  bool counts_success;  // generations are counted; probes and listings only when refused
};
constexpr Route kRoutes[] = {
    {"/v1/images/generations", "POST", "images.generations", true, true},
    {"/v1/images/edits", "POST", "images.edits", true, true},
    {"/v1/models", "GET", "models", true, false},
    {"/v1/loras", "GET", "loras", true, false},
    {"/health", "GET", "health", false, false},
    {"/ready", "GET", "ready", false, false},
    {"/openapi.json", "GET", "openapi", false, false},
};
constexpr char kUnroutedMethod[] = "http";

// RFC 9110's methods (case-sensitive): any other is 501, whatever the path.
bool known_method(std::string_view method) {
  for (std::string_view known :
       {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}) {
    if (method == known) return true;
  }
  return false;
}

const Route* find_route(std::string_view path) {
  for (const Route& route : kRoutes) {
    if (path == route.path) return &route;
  }
  return nullptr;
}

bool is_generation(const Route& route) {
  return route.counts_success;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

http::Response json_response(int status, const json& body) {
  return {status, {{"Content-Type", "application/json"}}, dump_json(body)};
}

// OpenAI's error JSON with the status that fits, and the fields a client needs to act on it.
http::Response error_response(const absl::Status& status) {
  const int code = http_status_of(status);
  http::Response response = json_response(code, openai_error_body(status));
  if (code == 429 || code == 503) {
    response.headers.emplace_back("Retry-After", absl::StrCat(kRetryAfterSeconds));
  }
  if (code == 401) response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

std::string request_id_of(const http::RequestHead& head) {
  const std::optional<std::string_view> id = head.value("X-Request-Id");
  return id ? std::string(*id) : std::string();
}

// The deadline X-Request-Timeout sets (decimal seconds from arrival, e.g. "30" or "2.5"), max()
// without one; InvalidArgument naming the header for anything else (hex, exponents, empty,
// repeated, not positive, over a year).
absl::StatusOr<Clock::time_point> request_deadline(const http::RequestHead& head,
                                                   Clock::time_point arrival) {
  const std::vector<std::string_view> values = head.values(kRequestTimeoutHeader);
  if (values.empty()) return Clock::time_point::max();
  const std::string text = values.size() == 1 ? std::string(values[0]) : std::string();
  bool decimal = !text.empty() && text.find_first_not_of("0123456789.") == std::string::npos &&
                 std::count(text.begin(), text.end(), '.') <= 1 && text.front() != '.' &&
                 text.back() != '.';
  double seconds = 0;
  if (!decimal || !absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 86400 * 365) {
    return invalid_argument_status(
        {{kRequestTimeoutHeader,
          values.size() > 1
              ? std::string("sent more than once")
              : absl::StrCat("'", text, "' is not a positive decimal number of seconds")}});
  }
  return arrival +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

// Withdraws jobs whose X-Request-Timeout passed (a queued job would otherwise wait for the
// worker to notice): one thread, woken at the earliest deadline.
class DeadlineWatch {
 public:
  DeadlineWatch() : thread_([this] { run(); }) {}
  ~DeadlineWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Runs `expire` once `deadline` passes (on the watch's thread), unless the watch stops first.
  void watch(Clock::time_point deadline, std::function<void()> expire) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.emplace(deadline, std::move(expire));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (pending_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const auto first = pending_.begin();
      if (Clock::now() < first->first) {
        cv_.wait_until(lock, first->first);
        continue;
      }
      std::function<void()> expire = std::move(first->second);
      pending_.erase(first);
      lock.unlock();
      expire();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::function<void()>> pending_;  // guarded by mu_
  bool stop_ = false;                                                // guarded by mu_
  std::thread thread_;
};

namespace {

// One generation request from its body to its answer: held by a shared_ptr that the job's event
// stream, the exchange's on_gone and the deadline watch reach through weak pointers.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(ServingCore& core, const Route& route, std::shared_ptr<http::Exchange> exchange)
      : core_(core), route_(route), exchange_(std::move(exchange)), arrival_(Clock::now()) {
    request_id_ = loggable_request_id(request_id_of(exchange_->request()));
  }

  void run(DeadlineWatch& deadlines) {
    const http::Request& req = exchange_->request();
    absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
    if (!serving.ok()) return fail(serving.status());
    absl::StatusOr<OpenAiImageRequest> parsed = parse(req, (*serving)->info.model_name);
    if (!parsed.ok()) return fail(parsed.status());
    parsed->request.request_id = request_id_of(req);
    absl::StatusOr<Clock::time_point> deadline = request_deadline(req, arrival_);
    if (!deadline.ok()) return fail(deadline.status());
    stream_ = parsed->stream;
    std::weak_ptr<Generation> weak = weak_from_this();
    events_ = std::make_shared<JobEvents>(JobEvents::Wants{.progress = stream_, .images = stream_},
                                          [weak] {
                                            if (auto self = weak.lock()) self->on_events();
                                          });
    absl::StatusOr<std::shared_ptr<Job>> job =
        core_.create_job(parsed->request, arrival_, *deadline, events_, &model_);
    if (!job.ok()) return fail(with_openai_params(job.status()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = *job;
      keep_alive_ = shared_from_this();  // until answered: the job's events reach it weakly
    }
    if (absl::Status admitted = core_.admit(*job); !admitted.ok()) return fail(admitted);
    if (stream_) {
      exchange_->begin_stream(
          200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}},
          ": keep-alive\n\n");
    }
    exchange_->on_gone([weak] {
      if (auto self = weak.lock()) self->withdraw(absl::CancelledError("the client went away"));
    });
    if (*deadline != Clock::time_point::max()) {
      deadlines.watch(*deadline, [weak] {
        if (auto self = weak.lock()) {
          self->withdraw(absl::DeadlineExceededError(
              absl::StrCat("the request deadline (", kRequestTimeoutHeader, ") passed")));
        }
      });
    }
    // Events pushed so far waited for the stream to begin (a fast worker may have finished the
    // job already): drain them now.
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_ = true;
    }
    on_events();
  }

 private:
  absl::StatusOr<OpenAiImageRequest> parse(const http::Request& req, absl::string_view model) {
    if (route_.path == std::string_view("/v1/images/generations")) {
      return parse_generations_body(req.body, model);
    }
    const std::optional<std::string_view> type = req.value("Content-Type");
    absl::StatusOr<std::vector<http::FormPart>> parts =
        http::parse_form_data(type.value_or(""), req.body);
    if (!parts.ok())
      return invalid_argument_status({{"body", std::string(parts.status().message())}});
    return parse_edits_form(*parts, model);
  }

  void withdraw(const absl::Status& reason) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job = job_;
    }
    if (job) core_.withdraw(job, reason);
  }

  // Drains the job's events into the exchange: server-sent events for a stream, the answer when
  // the job ended. Called on the thread that pushed (the worker, the encoder, an I/O thread).
  void on_events() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!events_ || answered_ || !started_) return;
    while (std::optional<JobEvent> event = events_->next()) {
      if (event->kind == JobEvent::Kind::kProgress) {
        exchange_->write(sse_progress_event(event->progress));
      } else if (event->kind == JobEvent::Kind::kImage) {
        exchange_->write(sse_image_event(event->image, event->image_index, job_->spec().num_images,
                                         job_->spec(), created_));
      } else {
        answer(event->status, std::move(event->result));
        return;
      }
    }
  }

  // The job ended with `status` (mu_ held).
  void answer(const absl::Status& status, JobResult&& result) {
    answered_ = true;
    // Released once this returns (the caller's shared_ptr from weak.lock() keeps it until then).
    keep_alive_.reset();
    // Counted before the answer goes out, so a client that reads the metrics next finds it; what
    // the client saw: nothing, when it went away first.
    record(exchange_->gone() ? absl::CancelledError("the client went away") : status);
    if (stream_) {
      if (!status.ok()) exchange_->write(sse_error_event(status));
      exchange_->end_stream();
    } else if (status.ok()) {
      exchange_->respond(
          json_response(200, openai_images_response(job_->spec(), result, model_->info.model_name,
                                                    created_, seconds_since(arrival_))));
    } else {
      exchange_->respond(error_response(status));
    }
  }

  void fail(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    answered_ = true;
    keep_alive_.reset();
    record(status);
    exchange_->respond(error_response(status));
  }

  void record(const absl::Status& status) {
    record_finished_request(core_.metrics(), route_.label, request_id_, status,
                            seconds_since(arrival_), exchange_->request().peer,
                            job_ ? &job_->spec() : nullptr);
  }

  ServingCore& core_;
  const Route& route_;
  const std::shared_ptr<http::Exchange> exchange_;
  const Clock::time_point arrival_;
  const int64_t created_ = unix_seconds();
  std::string request_id_;
  bool stream_ = false;
  std::shared_ptr<JobEvents> events_;
  std::shared_ptr<const ServingModel> model_;
  std::mutex mu_;
  std::shared_ptr<Job> job_;  // guarded by mu_ once the job is admitted
  bool answered_ = false;     // guarded by mu_
  // Set once run() has begun the answer (the stream's head); events wait in events_ until then.
  bool started_ = false;  // guarded by mu_
  // This generation itself from admission to its answer (nothing else holds it strongly).
  std::shared_ptr<Generation> keep_alive_;  // guarded by mu_
};

}  // namespace

HttpApi::HttpApi(ServingCore& core, std::string auth_token)
    : core_(core), auth_token_(std::move(auth_token)) {}

HttpApi::~HttpApi() {
  stop(Clock::now());
}

absl::Status HttpApi::start(const HttpApiOptions& options) {
  http::TransportOptions transport;
  transport.host = options.host;
  transport.port = options.port;
  transport.tls_cert_pem = options.tls_cert_pem;
  transport.tls_key_pem = options.tls_key_pem;
  transport.max_body_bytes = options.max_request_bytes;
  transport.head_timeout_s = options.head_timeout_s;
  transport.body_timeout_s = options.body_timeout_s;
  transport.idle_timeout_s = options.idle_timeout_s;
  transport.max_connections = options.max_connections;
  transport.max_connections_per_client = options.max_connections_per_client;
  deadlines_ = std::make_unique<DeadlineWatch>();
  transport_ = std::make_unique<http::Transport>(*this);
  if (absl::Status status = transport_->start(transport); !status.ok()) {
    transport_.reset();
    if (absl::IsUnavailable(status)) {
      return absl::UnavailableError(absl::StrCat("--http-port: ", status.message()));
    }
    return status;
  }
  port_ = transport_->port();
  return absl::OkStatus();
}

void HttpApi::stop(Clock::time_point deadline) {
  if (transport_) transport_->stop(deadline);
  transport_.reset();
  deadlines_.reset();
}

std::optional<http::Response> HttpApi::check_head(const http::RequestHead& head) {
  const Route* route = find_route(head.path);
  absl::Status refusal;
  if (!known_method(head.method)) {
    refusal = absl::UnimplementedError(
        absl::StrCat("the method '", head.method, "' is not implemented (methods are upper case)"));
  } else if (route == nullptr) {
    refusal = absl::NotFoundError(absl::StrCat("no route for ", head.method, " ", head.path));
  } else if (head.method != route->method) {
    refusal = absl::UnimplementedError(
        absl::StrCat(head.method, " is not allowed on ", route->path, "; use ", route->method));
  } else if (route->needs_token) {
    std::vector<absl::string_view> values;
    for (std::string_view value : head.values("Authorization")) {
      values.emplace_back(value.data(), value.size());
    }
    refusal = check_bearer_token(auth_token_, values);
  }
  if (refusal.ok() && route != nullptr && is_generation(*route)) {
    refusal = request_deadline(head, Clock::now()).status();
    if (refusal.ok()) refusal = core_.serving_model().status();
    const std::optional<std::string_view> type = head.value("Content-Type");
    if (refusal.ok() && route->path == std::string_view("/v1/images/edits") &&
        !(type && absl::StartsWithIgnoreCase(absl::string_view(type->data(), type->size()),
                                             "multipart/form-data"))) {
      refusal = invalid_argument_status(
          {{"body", "must be multipart/form-data with the image files and the fields"}});
    }
  }
  if (refusal.ok()) return std::nullopt;
  record_finished_request(core_.metrics(), route ? route->label : kUnroutedMethod,
                          loggable_request_id(request_id_of(head)), refusal, 0.0, head.peer,
                          nullptr);
  http::Response response = error_response(refusal);
  if (route != nullptr && known_method(head.method) && head.method != route->method) {
    response.status = 405;
    response.headers.emplace_back("Allow", route->method);
  }
  return response;
}

http::Response HttpApi::render_refusal(const http::Refusal& refusal) {
  const Route* route = find_route(refusal.path);
  absl::Status status;
  switch (refusal.status) {
    case 413:
      core_.metrics().count_resource_exhausted(kRequestTooLarge);
      status =
          absl::ResourceExhaustedError(absl::StrCat(refusal.message, " (--max-request-bytes)"));
      break;
    case 408:
      status = absl::DeadlineExceededError(refusal.message);
      break;
    case 503:
      status = absl::UnavailableError(refusal.message);
      break;
    case 501:
      status = absl::UnimplementedError(refusal.message);
      break;
    default:  // 400, 414, 415, 431: the request itself is malformed or too big to read
      status = absl::InvalidArgumentError(refusal.message);
  }
  record_finished_request(core_.metrics(), route ? route->label : kUnroutedMethod, "", status, 0.0,
                          refusal.peer, nullptr);
  http::Response response = json_response(refusal.status, openai_error_body(status));
  return response;
}

void HttpApi::handle(std::shared_ptr<http::Exchange> exchange) {
  const http::Request& req = exchange->request();
  const Route* route = find_route(req.path);
  if (route == nullptr) return;  // check_head refused it
  if (is_generation(*route)) {
    std::make_shared<Generation>(core_, *route, exchange)->run(*deadlines_);
  } else if (req.path == "/v1/models") {
    models(*exchange);
  } else if (req.path == "/v1/loras") {
    loras(*exchange);
  } else if (req.path == "/openapi.json") {
    exchange->respond({200, {{"Content-Type", "application/json"}}, kOpenApiDocument});
  } else {
    // A probe's 503 is its answer, not a refused request: not counted.
    const Health health = core_.state().health();
    const absl::Status& status = req.path == "/health" ? health.live : health.ready;
    if (!status.ok()) {
      exchange->respond(error_response(status));
      return;
    }
    exchange->respond(
        json_response(200, json{{"status", req.path == "/health" ? "live" : "ready"}}));
  }
}

void HttpApi::models(http::Exchange& exchange) {
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
  if (!serving.ok()) {
    record_finished_request(core_.metrics(), "models", "", serving.status(), 0.0,
                            exchange.request().peer, nullptr);
    exchange.respond(error_response(serving.status()));
    return;
  }
  const PipelineInfo& info = (*serving)->info;
  json limits = json::object();
  for (const LimitEntry& entry : limit_entries((*serving)->limits)) {
    const bool integral = entry.value == static_cast<double>(static_cast<int64_t>(entry.value));
    limits[entry.name] = integral ? json(static_cast<int64_t>(entry.value)) : json(entry.value);
  }
  exchange.respond(
      json_response(200, json{{"object", "list"},
                              {"data", json::array({json{{"id", info.model_name},
                                                         {"object", "model"},
                                                         {"created", 0},
                                                         {"owned_by", "flux2"},
                                                         {"variant", info.variant},
                                                         {"pipeline_class", info.pipeline_class},
                                                         {"limits", limits}}})}}));
}

void HttpApi::loras(http::Exchange& exchange) {
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
  if (!serving.ok()) {
    record_finished_request(core_.metrics(), "loras", "", serving.status(), 0.0,
                            exchange.request().peer, nullptr);
    exchange.respond(error_response(serving.status()));
    return;
  }
  std::vector<LoraListing> listing;
  if (const ServingModel& model = **serving; model.loras != nullptr) {
    const Engine* engine = model.engine;
    listing =
        model.loras->list([engine](const std::string& key) { return engine->lora_resident(key); });
  }
  exchange.respond(json_response(200, openai_lora_list_json(listing)));
}

}  // namespace flux2::server
