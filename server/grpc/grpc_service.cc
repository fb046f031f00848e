// The flux2.v1.ImageGeneration handlers (callback API); see grpc_service.h.
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#include "server/grpc/grpc_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/status.h"
#include "server/common/bearer_token.h"
#include "server/grpc/raw_messages.h"
#include "server/grpc/request_conversion.h"
#include "server/grpc/rpc_status.h"
#include "server/serving/access_log.h"
#include "server/serving/validate.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;

// A client whose own deadline expires cancels the stream itself, and that cancel can reach the
// server just before the server's copy of the deadline (which starts later, when the request
// arrives). Cancels this close to the deadline are counted as DEADLINE_EXCEEDED, and the job's own
// deadline is this much earlier than the server's copy, so a reply the server still sends as OK
// reaches a client that is still waiting for it.
constexpr auto kDeadlineSlack = std::chrono::milliseconds(100);

// The call's gRPC deadline on the steady clock, less kDeadlineSlack (max() when it has none).
Clock::time_point steady_deadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  const auto now = std::chrono::system_clock::now();
  // gRPC reports "no deadline" as a time far in the future; anything beyond a year counts as none.
  if (deadline - now > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - now) -
         kDeadlineSlack;
}

// Why a call was cancelled: its deadline passed, or the client (or the transport) gave up.
absl::Status cancel_reason(const grpc::CallbackServerContext& context) {
  if (std::chrono::system_clock::now() + kDeadlineSlack >= context.deadline()) {
    return absl::DeadlineExceededError("the request deadline passed");
  }
  return absl::CancelledError("the client cancelled the request");
}

// GenerateImage: one reactor per call; deletes itself when gRPC is done with it. It hears only
// the job's end.
class GenerateImageReactor final : public grpc::ServerUnaryReactor {
 public:
  GenerateImageReactor(ImageGenerationService& service, grpc::CallbackServerContext* context,
                       const grpc::ByteBuffer& raw_request, grpc::ByteBuffer* raw_response)
      : service_(service), context_(context), raw_response_(raw_response), arrival_(Clock::now()) {
    service_.call_started();
    events_ = std::make_shared<JobEvents>(JobEvents::Wants{}, [this] { on_event(); });
    absl::StatusOr<std::shared_ptr<Job>> job =
        service_.make_job(context, raw_request, arrival_, events_, &request_id_, &model_);
    if (!job.ok()) {
      reply(job.status());
      return;
    }
    // The whole response is one message: refuse before compute what a client with the default
    // receive limit could not take (GenerateImageStream is not limited this way).
    const absl::Status fits = check_unary_response_size((*job)->spec(), model_->limits);
    if (!fits.ok()) {
      reply(fits);
      return;
    }
    job_ = *job;
    // From here on the job's end replies, even when admission itself fails.
    const absl::Status admitted = service_.core().admit(job_);
    if (!admitted.ok()) {
      job_ = nullptr;
      reply(admitted);
    }
  }

  void OnCancel() override {
    if (job_) service_.core().withdraw(job_, cancel_reason(*context_));
  }
  void OnDone() override {
    ImageGenerationService& service = service_;
    delete this;
    service.call_done();
  }

 private:
  // The unary call wants only the job's end; replying may delete the reactor (OnDone), so
  // nothing touches it afterwards.
  void on_event() {
    std::optional<JobEvent> event = events_->next();
    if (event && event->kind == JobEvent::Kind::kDone) {
      on_job_done(event->status, std::move(event->result));
    }
  }

  void on_job_done(absl::Status status, JobResult&& result) {
    if (status.ok()) {
      fill_generate_response(job_->spec(), std::move(result), *model_, seconds_since(arrival_),
                             &response_);
      // Cannot happen while unary_response_bound_bytes holds; if it does, the client would fail
      // on its receive limit, so the call is not an OK one.
      const size_t bytes = response_.ByteSizeLong();
      if (bytes > static_cast<size_t>(model_->limits.max_response_bytes)) {
        response_.Clear();
        service_.core().metrics().count_resource_exhausted(kResponseTooLarge);
        status = absl::ResourceExhaustedError(
            absl::StrCat("the response of ", bytes, " bytes exceeds --max-response-bytes ",
                         model_->limits.max_response_bytes, "; use GenerateImageStream"));
      }
    }
    reply(status);
  }

  void reply(absl::Status status) {
    // A cancel that came after the job's last check: the client saw CANCELLED (or its deadline).
    if (status.ok() && context_->IsCancelled()) status = cancel_reason(*context_);
    if (status.ok()) status = serialize_message(response_, raw_response_);
    response_.Clear();
    record_finished_request(service_.core().metrics(), "GenerateImage", request_id_, status,
                            seconds_since(arrival_), context_->peer(),
                            job_ ? &job_->spec() : nullptr);
    Finish(to_grpc_status(status));
  }

  ImageGenerationService& service_;
  grpc::CallbackServerContext* context_;
  v1::GenerateImageResponse response_;  // serialized into raw_response_ by reply()
  grpc::ByteBuffer* raw_response_;
  const Clock::time_point arrival_;
  std::string request_id_;
  std::shared_ptr<JobEvents> events_;
  std::shared_ptr<const ServingModel> model_;
  std::shared_ptr<Job> job_;  // set before the reactor is returned to gRPC; OnCancel reads it
};

// GenerateImageStream: one message per job event, one write at a time (a server stream allows
// one outstanding write); the job's event stream is the write queue.
class GenerateImageStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateImageStreamReactor(ImageGenerationService& service, grpc::CallbackServerContext* context,
                             const grpc::ByteBuffer& raw_request)
      : service_(service), context_(context), arrival_(Clock::now()) {
    service_.call_started();
    events_ = std::make_shared<JobEvents>(JobEvents::Wants{.progress = true, .images = true},
                                          [this] { pump(); });
    absl::StatusOr<std::shared_ptr<Job>> job =
        service_.make_job(context, raw_request, arrival_, events_, &request_id_, &model_);
    if (!job.ok()) {
      finish_with(job.status());
      return;
    }
    job_ = *job;
    const absl::Status admitted = service_.core().admit(job_);
    if (!admitted.ok()) {
      job_ = nullptr;
      finish_with(admitted);
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok && job_) {
      // The stream is broken (client cancelled or gone, or the deadline passed): stop the job now
      // rather than at OnCancel, which may come later. withdraw() is idempotent.
      service_.core().withdraw(job_, cancel_reason(*context_));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) broken_ = true;
    }
    pump();
  }
  void OnCancel() override {
    if (job_) service_.core().withdraw(job_, cancel_reason(*context_));
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
  }
  void OnDone() override {
    ImageGenerationService& service = service_;
    delete this;
    service.call_done();
  }

 private:
  // The message of `event`; false for a done event that carries no message (a failed job).
  bool to_message(JobEvent& event, v1::GenerateImageStreamResponse* message) {
    switch (event.kind) {
      case JobEvent::Kind::kProgress: {
        v1::Progress* progress = message->mutable_progress();
        progress->set_step_index(event.progress.step_index);
        progress->set_step_count(event.progress.step_count);
        progress->set_step_seconds(event.progress.step_seconds);
        progress->set_elapsed_seconds(event.progress.elapsed_seconds);
        progress->set_image_index(event.progress.image_index);
        progress->set_num_images(event.progress.num_images);
        if (event.progress.cache.enabled) {
          cache_to_proto(event.progress.cache, progress->mutable_cache());
        }
        return true;
      }
      case JobEvent::Kind::kImage:
        set_image_metadata(event.image, message->mutable_image());
        message->mutable_image()->set_data(
            std::string(event.image.bytes.begin(), event.image.bytes.end()));
        return true;
      case JobEvent::Kind::kDone:
        final_status_ = event.status;
        finishing_ = true;
        if (!event.status.ok()) return false;
        // The bytes went out in the `image` events; the result describes them.
        fill_generate_response(job_->spec(), std::move(event.result), *model_,
                               seconds_since(arrival_), message->mutable_result());
        return true;
    }
    return false;
  }

  void finish_with(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_status_ = status;
      finishing_ = true;
    }
    pump();
  }

  // Starts the next write, or finishes the call once the job is over and every event is
  // written. Finish() runs after unlocking: OnDone (which deletes this) may follow it at once on
  // another thread, so nothing may touch the reactor after it.
  void pump() {
    std::unique_lock<std::mutex> lock(mu_);
    if (writing_ || finished_) return;
    while (std::optional<JobEvent> event = events_->next()) {
      v1::GenerateImageStreamResponse message;
      // A broken stream writes nothing more; it only waits for the job's end.
      if (!to_message(*event, &message) || broken_) continue;
      const absl::Status serialized = serialize_message(message, &current_);
      if (!serialized.ok()) {
        final_status_ = serialized;
        finishing_ = true;
        if (job_) job_->cancel(serialized);
        break;
      }
      writing_ = true;
      StartWrite(&current_);
      return;
    }
    if (!finishing_) return;
    finished_ = true;
    // A stream that broke (a write failed, the client cancelled or stopped reading until its
    // deadline) did not deliver everything, whatever the job's own outcome.
    if (broken_ && final_status_.ok()) final_status_ = cancel_reason(*context_);
    record_finished_request(service_.core().metrics(), "GenerateImageStream", request_id_,
                            final_status_, seconds_since(arrival_), context_->peer(),
                            job_ ? &job_->spec() : nullptr);
    const grpc::Status status = to_grpc_status(final_status_);
    lock.unlock();
    Finish(status);
  }

  ImageGenerationService& service_;
  grpc::CallbackServerContext* context_;
  const Clock::time_point arrival_;
  std::string request_id_;
  std::shared_ptr<JobEvents> events_;
  std::shared_ptr<const ServingModel> model_;
  std::shared_ptr<Job> job_;

  std::mutex mu_;
  grpc::ByteBuffer current_;   // the write in progress, serialized
  bool writing_ = false;       // guarded by mu_
  bool finishing_ = false;     // guarded by mu_: the job is over (or never started)
  bool finished_ = false;      // guarded by mu_: Finish was called
  bool broken_ = false;        // guarded by mu_: a write failed or the call was cancelled
  absl::Status final_status_;  // guarded by mu_
};

}  // namespace

ImageGenerationService::ImageGenerationService(ServingCore& core, std::string auth_token)
    : core_(core), auth_token_(std::move(auth_token)) {}

void ImageGenerationService::call_started() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  ++open_calls_;
}

void ImageGenerationService::call_done() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  --open_calls_;
  calls_cv_.notify_all();
}

bool ImageGenerationService::wait_for_no_calls(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(calls_mu_);
  return calls_cv_.wait_until(lock, deadline, [this] { return open_calls_ == 0; });
}

absl::Status ImageGenerationService::authenticate(
    const grpc::CallbackServerContext& context) const {
  std::vector<absl::string_view> values;
  const auto range = context.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it)
    values.emplace_back(it->second.data(), it->second.size());
  return check_bearer_token(auth_token_, values);
}

absl::StatusOr<std::shared_ptr<Job>> ImageGenerationService::make_job(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer& raw, Clock::time_point arrival,
    std::shared_ptr<JobEvents> events, std::string* request_id,
    std::shared_ptr<const ServingModel>* model) {
  v1::GenerateImageRequest proto;
  FLUX_RETURN_IF_ERROR(parse_message(raw, &proto));
  *request_id = loggable_request_id(proto.request_id());
  FLUX_RETURN_IF_ERROR(authenticate(*context));
  FLUX_ASSIGN_OR_RETURN(GenerateRequest request, request_from_proto(proto));
  return core_.create_job(request, arrival, steady_deadline(*context), std::move(events), model);
}

grpc::ServerUnaryReactor* ImageGenerationService::GenerateImage(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return new GenerateImageReactor(*this, context, *request, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ImageGenerationService::GenerateImageStream(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new GenerateImageStreamReactor(*this, context, *request);
}

grpc::ServerUnaryReactor* ImageGenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* raw_request,
                                                               grpc::ByteBuffer* raw_response) {
  const Clock::time_point arrival = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::GetModelInfoRequest request;
  absl::Status status = parse_message(*raw_request, &request);
  if (status.ok()) status = authenticate(*context);
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
  if (status.ok()) status = serving.status();
  if (status.ok()) {
    v1::GetModelInfoResponse response;
    fill_model_info(**serving, &response);
    status = serialize_message(response, raw_response);
  }
  core_.metrics().count_request("GetModelInfo", status_code_name(status), seconds_since(arrival));
  reactor->Finish(to_grpc_status(status));
  return reactor;
}

grpc::ServerUnaryReactor* ImageGenerationService::ListLoras(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* raw_request,
                                                            grpc::ByteBuffer* raw_response) {
  const Clock::time_point arrival = Clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::ListLorasRequest request;
  absl::Status status = parse_message(*raw_request, &request);
  if (status.ok()) status = authenticate(*context);
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving = core_.serving_model();
  if (status.ok()) status = serving.status();
  if (status.ok()) {
    v1::ListLorasResponse response;
    fill_lora_list(**serving, &response);
    status = serialize_message(response, raw_response);
  }
  core_.metrics().count_request("ListLoras", status_code_name(status), seconds_since(arrival));
  reactor->Finish(to_grpc_status(status));
  return reactor;
}

}  // namespace flux2::server
