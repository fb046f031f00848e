// The OpenAI-compatible HTTP API on cpp-httplib; see http_api.h.
// Tested by tests/server/http_api_test.cc and tests/server/openai_client_test.mjs.
#include "server/http/http_api.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "model/json_util.h"
#include "server/common/bearer_token.h"
#include "server/http/http_connection.h"
#include "server/http/openai_images.h"
#include "server/serving/access_log.h"
#include "server/serving/field_violations.h"

namespace flux2::server {

// The OpenAPI 3 document served at /openapi.json (server/http/openapi.json, embedded at build
// time).
extern const char kOpenApiDocument[];

namespace {

using nlohmann::json;

// How often a waiting handler looks at its connection and deadline: well under one denoising
// step (tens of milliseconds on the GPU at the smallest sizes, more everywhere else).
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// Labels of flux2_requests_total{method} for the two generation endpoints.
constexpr char kGenerationsMethod[] = "images.generations";
constexpr char kEditsMethod[] = "images.edits";

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void respond_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void respond_error(httplib::Response& res, const absl::Status& status) {
  const int code = http_status_of(status);
  if (code == 429 || code == 503) res.set_header("Retry-After", absl::StrCat(kRetryAfterSeconds));
  if (code == 401) res.set_header("WWW-Authenticate", "Bearer");
  respond_json(res, code, openai_error_body(status));
}

absl::Status authenticate(const std::string& token, const httplib::Request& req) {
  std::vector<absl::string_view> values;
  const auto [begin, end] = req.headers.equal_range("Authorization");
  for (auto it = begin; it != end; ++it) values.emplace_back(it->second);
  return check_bearer_token(token, values);
}

// The deadline the X-Request-Timeout header sets (seconds from arrival), max() without one.
absl::StatusOr<Clock::time_point> request_deadline(const httplib::Request& req,
                                                   Clock::time_point arrival) {
  if (!req.has_header(kRequestTimeoutHeader)) return Clock::time_point::max();
  const std::string text = req.get_header_value(kRequestTimeoutHeader);
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 86400 * 365) {
    return invalid_argument_status(
        {{kRequestTimeoutHeader,
          absl::StrCat("'", text, "' is not a positive number of seconds")}});
  }
  return arrival +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// What one HTTP generation shares with its job's callbacks (which run on the worker and encoder
// threads) and with the handler or the event-stream provider waiting on it.
struct HttpCall {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> events;  // guarded by mu: server-sent events not yet written
  bool done = false;               // guarded by mu: the job finished
  absl::Status status;             // guarded by mu
  JobResult result;                // guarded by mu
  bool recorded = false;           // guarded by mu: counted and logged
};

// One generation request from parse to answer; held by a shared_ptr so an event stream's content
// provider keeps it alive after the handler returns.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(ServingCore& core, const std::string& token, const char* method,
             const httplib::Request& req)
      : core_(core), token_(token), method_(method), req_(req), arrival_(Clock::now()) {
    request_id_ = loggable_request_id(req.get_header_value("X-Request-Id"));
    req_peer_ = absl::StrCat(req.remote_addr, ":", req.remote_port);
  }

  // Parses with `parse` (the endpoint's body reader) and answers `res`: the JSON response, an
  // error, or an event stream.
  template <typename Parse>
  void run(httplib::Response& res, Parse parse) {
    absl::Status status = authenticate(token_, req_);
    absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
    if (status.ok()) status = serving.status();
    if (!status.ok()) return fail(res, status);
    absl::StatusOr<OpenAiImageRequest> parsed = parse((*serving)->info.model_name);
    if (!parsed.ok()) return fail(res, parsed.status());
    parsed->request.request_id = req_.get_header_value("X-Request-Id");
    absl::StatusOr<Clock::time_point> deadline = request_deadline(req_, arrival_);
    if (!deadline.ok()) return fail(res, deadline.status());
    deadline_ = *deadline;
    stream_ = parsed->stream;
    std::shared_ptr<HttpCall> call = call_;
    created_ = unix_seconds();
    events_ = std::make_shared<JobEvents>(JobEvents::Wants{.progress = stream_, .images = stream_},
                                          [call] {
                                            std::lock_guard<std::mutex> lock(call->mu);
                                            call->cv.notify_all();
                                          });
    absl::StatusOr<std::shared_ptr<Job>> job =
        core_.create_job(parsed->request, arrival_, deadline_, events_, &model_);
    if (!job.ok()) return fail(res, with_openai_params(job.status()));
    job_ = *job;
    if (absl::Status admitted = core_.admit(job_); !admitted.ok()) {
      job_ = nullptr;
      return fail(res, admitted);
    }
    socket_ = find_connection_socket(req_.local_addr, req_.local_port, req_.remote_addr,
                                     req_.remote_port);
    if (stream_) {
      start_event_stream(res);
    } else {
      answer_when_done(res);
    }
  }

 private:
  void fail(httplib::Response& res, const absl::Status& status) {
    record(status);
    respond_error(res, status);
  }

  // Counts and logs the request once, with what its client saw.
  void record(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(call_->mu);
      if (call_->recorded) return;
      call_->recorded = true;
    }
    record_finished_request(core_.metrics(), method_, request_id_, status, seconds_since(arrival_),
                            req_peer_, job_ ? &job_->spec() : nullptr);
  }

  // Moves the job's events into the call (the lock held): server-sent events for a stream, the
  // outcome when the job ended.
  void take_events() {
    while (std::optional<JobEvent> event = events_->next()) {
      switch (event->kind) {
        case JobEvent::Kind::kProgress:
          call_->events.push_back(sse_progress_event(event->progress));
          break;
        case JobEvent::Kind::kImage:
          call_->events.push_back(sse_image_event(event->image, event->image_index,
                                                  job_->spec().num_images, job_->spec(), created_));
          break;
        case JobEvent::Kind::kDone:
          call_->done = true;
          call_->status = event->status;
          call_->result = std::move(event->result);
          break;
      }
    }
  }

  // Waits (the lock held) until the job finished or an event is pending, withdrawing the job when
  // the client hangs up or the deadline passes. Returns whether the client hung up.
  bool wait(std::unique_lock<std::mutex>& lock, bool until_done) {
    bool hung_up = false;
    take_events();
    while (!call_->done && (until_done || call_->events.empty())) {
      call_->cv.wait_for(lock, kPollInterval);
      take_events();
      if (call_->done) break;
      absl::Status reason;
      if (!hung_up && peer_hung_up(socket_)) {
        hung_up = true;
        reason = absl::CancelledError("the client closed the connection");
      } else if (Clock::now() >= deadline_) {
        reason = absl::DeadlineExceededError(
            absl::StrCat("the request deadline (", kRequestTimeoutHeader, ") passed"));
      }
      if (!reason.ok()) {
        lock.unlock();
        core_.withdraw(job_, reason);  // finishes a queued job at once (its wake takes mu)
        lock.lock();
        take_events();
      }
    }
    return hung_up || peer_hung_up(socket_);
  }

  void answer_when_done(httplib::Response& res) {
    std::unique_lock<std::mutex> lock(call_->mu);
    const bool hung_up = wait(lock, /*until_done=*/true);
    const absl::Status status = call_->status;
    JobResult result = std::move(call_->result);
    lock.unlock();
    if (hung_up) {
      // Nobody reads the answer: what the client saw is a cancelled request.
      record(absl::CancelledError("the client closed the connection"));
      res.status = 499;
      return;
    }
    record(status);
    if (!status.ok()) return respond_error(res, status);
    respond_json(res, 200,
                 openai_images_response(job_->spec(), result, model_->info.model_name,
                                        unix_seconds(), seconds_since(arrival_)));
  }

  // The response becomes a text/event-stream the provider below fills from the job's events; it
  // runs on this handler's thread after the handler returns, so it owns copies of what it needs.
  void start_event_stream(httplib::Response& res) {
    std::shared_ptr<Generation> self = shared_from_this();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [self](size_t /*offset*/, httplib::DataSink& sink) { return self->write_next(sink); },
        [self](bool success) {
          if (success) return;
          // The connection broke or a write failed: stop the job, count what the client saw.
          self->core_.withdraw(self->job_, absl::CancelledError("the client closed the stream"));
          self->record(absl::CancelledError("the client closed the stream"));
        });
  }

  bool write_next(httplib::DataSink& sink) {
    std::unique_lock<std::mutex> lock(call_->mu);
    wait(lock, /*until_done=*/false);
    if (!call_->events.empty()) {
      const std::string event = std::move(call_->events.front());
      call_->events.pop_front();
      lock.unlock();
      return sink.write(event.data(), event.size());
    }
    const absl::Status status = call_->status;
    lock.unlock();
    if (!status.ok()) {
      const std::string event = sse_error_event(status);
      if (!sink.write(event.data(), event.size())) return false;
    }
    record(status);
    sink.done();
    return true;
  }

  ServingCore& core_;
  const std::string& token_;
  const char* method_;
  const httplib::Request& req_;  // valid while the handler and its content provider run
  const Clock::time_point arrival_;
  std::string request_id_;
  std::string req_peer_;  // "address:port" of the client
  Clock::time_point deadline_ = Clock::time_point::max();
  bool stream_ = false;
  int socket_ = -1;
  int64_t created_ = 0;
  std::shared_ptr<HttpCall> call_ = std::make_shared<HttpCall>();
  std::shared_ptr<JobEvents> events_;
  std::shared_ptr<const ServingModel> model_;
  std::shared_ptr<Job> job_;
};

std::vector<FormPart> form_parts(const httplib::Request& req) {
  std::vector<FormPart> parts;
  for (const auto& [name, file] : req.files) parts.push_back({name, file.filename, file.content});
  return parts;
}

// Only SO_REUSEADDR: cpp-httplib's defaults may add SO_REUSEPORT, which would let a second server
// share the port silently instead of failing to bind.
void listen_socket_options(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

}  // namespace

HttpApi::HttpApi(ServingCore& core, std::string auth_token)
    : core_(core), auth_token_(std::move(auth_token)) {}

HttpApi::~HttpApi() {
  stop();
}

absl::Status HttpApi::start(const HttpApiOptions& options) {
  if (!options.tls_cert_file.empty()) {
    server_ = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                   options.tls_key_file.c_str());
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  if (!server_->is_valid()) {
    return absl::UnavailableError("--http-port: cannot load the TLS certificate and key");
  }
  const int threads = options.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_socket_options(listen_socket_options);
  server_->set_payload_max_length(static_cast<size_t>(options.max_request_bytes));
  server_->set_read_timeout(30);
  server_->set_write_timeout(60);
  server_->set_keep_alive_timeout(5);
  add_routes();
  const int64_t limit = options.max_request_bytes;
  server_->set_error_handler([this, limit](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error
    absl::Status status;
    if (res.status == 413) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the request body exceeds this server's limit of ", limit,
                       " bytes (--max-request-bytes)"));
      if (req.path == "/v1/images/generations" || req.path == "/v1/images/edits") {
        const char* method = req.path == "/v1/images/edits" ? kEditsMethod : kGenerationsMethod;
        core_.metrics().count_resource_exhausted(kRequestTooLarge);
        record_finished_request(core_.metrics(), method, "", status, 0.0,
                                absl::StrCat(req.remote_addr, ":", req.remote_port), nullptr);
      }
      respond_json(res, 413, openai_error_body(status));
      return;
    }
    status = res.status == 404
                 ? absl::NotFoundError(absl::StrCat("no route for ", req.method, " ", req.path))
                 : absl::InvalidArgumentError(absl::StrCat("HTTP ", res.status));
    const int code = res.status;
    respond_json(res, code, openai_error_body(status));
  });
  const bool bound = options.port == 0 ? (port_ = server_->bind_to_any_port(options.host)) > 0
                                       : server_->bind_to_port(options.host, options.port);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat("--http-port: cannot listen on ", options.host, ":",
                                               options.port, " (in use?)"));
  }
  if (options.port != 0) port_ = options.port;
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
  // cpp-httplib 0.11's stop() does nothing until the accept loop has begun (it tests
  // is_running()): a stop soon after start, as when the model fails to load at once, would leave
  // the loop running and stop()'s join() waiting for ever. So start returns once the loop runs.
  while (!server_->is_running() && !listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

void HttpApi::stop() {
  if (!server_) return;
  server_->stop();
  // Idle keep-alive connections would each hold the stop for their timeout (5 s).
  if (port_ > 0) shut_down_connections(port_);
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

void HttpApi::add_routes() {
  server_->Post("/v1/images/generations",
                [this](const httplib::Request& req, httplib::Response& res) {
                  std::make_shared<Generation>(core_, auth_token_, kGenerationsMethod, req)
                      ->run(res, [&req](absl::string_view model) {
                        return parse_generations_body(req.body, model);
                      });
                });
  server_->Post("/v1/images/edits", [this](const httplib::Request& req, httplib::Response& res) {
    std::make_shared<Generation>(core_, auth_token_, kEditsMethod, req)
        ->run(res, [&req](absl::string_view model) {
          if (!req.is_multipart_form_data()) {
            return absl::StatusOr<OpenAiImageRequest>(invalid_argument_status(
                {{"body", "must be multipart/form-data with the image files and the fields"}}));
          }
          return parse_edits_form(form_parts(req), model);
        });
  });
  server_->Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    absl::Status status = authenticate(auth_token_, req);
    absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
    if (status.ok()) status = serving.status();
    if (!status.ok()) return respond_error(res, status);
    const PipelineInfo& info = (*serving)->info;
    json limits = json::object();
    for (const LimitEntry& entry : limit_entries((*serving)->limits)) {
      const bool integral = entry.value == static_cast<double>(static_cast<int64_t>(entry.value));
      limits[entry.name] = integral ? json(static_cast<int64_t>(entry.value)) : json(entry.value);
    }
    respond_json(res, 200,
                 json{{"object", "list"},
                      {"data", json::array({json{{"id", info.model_name},
                                                 {"object", "model"},
                                                 {"created", 0},
                                                 {"owned_by", "flux2"},
                                                 {"variant", info.variant},
                                                 {"pipeline_class", info.pipeline_class},
                                                 {"limits", limits}}})}});
  });
  server_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const absl::Status live = core_.state().health().live;
    if (live.ok()) return respond_json(res, 200, json{{"status", "live"}});
    respond_error(res, live);
  });
  server_->Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
    const absl::Status ready = core_.state().health().ready;
    if (ready.ok()) return respond_json(res, 200, json{{"status", "ready"}});
    respond_error(res, ready);
  });
  server_->Get("/openapi.json", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kOpenApiDocument, "application/json");
  });
}

}  // namespace flux2::server
