// The flux2.v1.ImageGeneration handlers (callback API); see grpc_service.h.
// Tested by tests/server/server_test.cc (fake engine) and the end-to-end tests.
#include "server/grpc/grpc_service.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/status.h"
#include "server/grpc/raw_messages.h"
#include "server/grpc/rpc_status.h"

#ifndef FLUX2_VERSION
#define FLUX2_VERSION "unknown"
#endif

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

v1::Quality to_proto(Quality quality) {
  return quality == Quality::kHigh ? v1::QUALITY_HIGH : v1::QUALITY_LOSSLESS;
}

// GenerateImage: one reactor per call; deletes itself when gRPC is done with it.
class GenerateImageReactor final : public grpc::ServerUnaryReactor {
 public:
  GenerateImageReactor(ImageGenerationService& service, grpc::CallbackServerContext* context,
                       const grpc::ByteBuffer& raw_request, grpc::ByteBuffer* raw_response)
      : service_(service), context_(context), raw_response_(raw_response), arrival_(Clock::now()) {
    service_.call_started();
    v1::GenerateImageRequest request;
    if (absl::Status parsed = parse_message(raw_request, &request); !parsed.ok()) {
      reply(parsed);
      return;
    }
    request_id_ = loggable_request_id(request.request_id());
    absl::StatusOr<std::shared_ptr<Job>> job = service_.make_job(
        context, request, arrival_, nullptr,
        [this](const absl::Status& status, JobResult&& result) {
          on_job_done(status, std::move(result));
        },
        &model_);
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
    // From here on the job's completion replies, even when admission itself fails.
    const absl::Status admitted = service_.host().admit(job_);
    if (!admitted.ok()) {
      job_ = nullptr;
      reply(admitted);
    }
  }

  void OnCancel() override {
    if (job_) service_.host().withdraw(job_, cancel_reason(*context_));
  }
  void OnDone() override {
    ImageGenerationService& service = service_;
    delete this;
    service.call_done();
  }

 private:
  void on_job_done(absl::Status status, JobResult&& result) {
    if (status.ok()) {
      fill_generate_response(job_->spec(), std::move(result), *model_, arrival_, &response_);
      // Cannot happen while unary_response_bound_bytes holds; if it does, the client would fail
      // on its receive limit, so the call is not an OK one.
      const size_t bytes = response_.ByteSizeLong();
      if (bytes > static_cast<size_t>(model_->limits.max_response_bytes)) {
        response_.Clear();
        service_.host().metrics().count_resource_exhausted(kResponseTooLarge);
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
    const double seconds = seconds_since(arrival_);
    record_finished_request(service_.host().metrics(), "GenerateImage", request_id_, status,
                            seconds, context_->peer(), job_ ? &job_->spec() : nullptr);
    Finish(to_grpc_status(status));
  }

  ImageGenerationService& service_;
  grpc::CallbackServerContext* context_;
  v1::GenerateImageResponse response_;  // serialized into raw_response_ by reply()
  grpc::ByteBuffer* raw_response_;
  const Clock::time_point arrival_;
  std::string request_id_;
  std::shared_ptr<const ServingModel> model_;
  std::shared_ptr<Job> job_;  // set before the reactor is returned to gRPC; OnCancel reads it
};

// GenerateImageStream: progress events and the result go through a write queue because a server
// stream allows one outstanding write at a time.
class GenerateImageStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateImageStreamReactor(ImageGenerationService& service, grpc::CallbackServerContext* context,
                             const grpc::ByteBuffer& raw_request)
      : service_(service), context_(context), arrival_(Clock::now()) {
    service_.call_started();
    v1::GenerateImageRequest request;
    if (absl::Status parsed = parse_message(raw_request, &request); !parsed.ok()) {
      finish_with(parsed);
      return;
    }
    request_id_ = loggable_request_id(request.request_id());
    absl::StatusOr<std::shared_ptr<Job>> job = service_.make_job(
        context, request, arrival_, [this](const ProgressEvent& event) { on_progress(event); },
        [this](const absl::Status& status, JobResult&& result) {
          on_job_done(status, std::move(result));
        },
        &model_);
    if (!job.ok()) {
      finish_with(job.status());
      return;
    }
    job_ = *job;
    job_->set_on_image([this](EncodedImage& image) { on_image(image); });
    const absl::Status admitted = service_.host().admit(job_);
    if (!admitted.ok()) {
      job_ = nullptr;
      finish_with(admitted);
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok && job_) {
      // The stream is broken (client cancelled or gone, or the deadline passed): stop the job now
      // rather than at OnCancel, which may come later. withdraw() is idempotent.
      service_.host().withdraw(job_, cancel_reason(*context_));
    }
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      pending_.clear();
      broken_ = true;
    }
    pump(lock);
  }
  void OnCancel() override {
    if (job_) service_.host().withdraw(job_, cancel_reason(*context_));
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
  }
  void OnDone() override {
    ImageGenerationService& service = service_;
    delete this;
    service.call_done();
  }

 private:
  void on_progress(const ProgressEvent& event) {
    v1::GenerateImageStreamResponse message;
    v1::Progress* progress = message.mutable_progress();
    progress->set_step_index(event.step_index);
    progress->set_step_count(event.step_count);
    progress->set_step_seconds(event.step_seconds);
    progress->set_elapsed_seconds(event.elapsed_seconds);
    progress->set_image_index(event.image_index);
    progress->set_num_images(event.num_images);
    std::unique_lock<std::mutex> lock(mu_);
    pending_.push_back(std::move(message));
    pump(lock);
  }

  // Runs on the encoder thread as each image is encoded: the bytes are copied into their own
  // message and freed here, so the result (built later from the same EncodedImage) carries the
  // metadata only and the job does not hold every image until the end.
  void on_image(EncodedImage& image) {
    v1::GenerateImageStreamResponse message;
    set_image_metadata(image, message.mutable_image());
    message.mutable_image()->set_data(std::string(image.bytes.begin(), image.bytes.end()));
    image.bytes = {};
    std::unique_lock<std::mutex> lock(mu_);
    pending_.push_back(std::move(message));
    pump(lock);
  }

  void on_job_done(const absl::Status& status, JobResult&& result) {
    v1::GenerateImageStreamResponse message;
    if (status.ok()) {
      fill_generate_response(job_->spec(), std::move(result), *model_, arrival_,
                             message.mutable_result());
      // The bytes went out in the `image` events (on_image emptied them; this makes it explicit).
      for (v1::Image& image : *message.mutable_result()->mutable_images()) image.clear_data();
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (status.ok()) pending_.push_back(std::move(message));
    final_status_ = status;
    finishing_ = true;
    pump(lock);
  }

  void finish_with(const absl::Status& status) {
    std::unique_lock<std::mutex> lock(mu_);
    final_status_ = status;
    finishing_ = true;
    pump(lock);
  }

  // Starts the next write, or finishes the call once the job is over and everything queued is
  // written. Finish() runs after unlocking: OnDone (which deletes this) may follow it at once on
  // another thread, so nothing may touch the reactor after it.
  void pump(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finished_) return;
    if (!pending_.empty()) {
      const absl::Status serialized = serialize_message(pending_.front(), &current_);
      pending_.pop_front();
      if (serialized.ok()) {
        writing_ = true;
        StartWrite(&current_);
        return;
      }
      pending_.clear();
      finishing_ = true;
      final_status_ = serialized;
      if (job_) job_->cancel(serialized);
    }
    if (!finishing_) return;
    finished_ = true;
    // A stream that broke (a write failed, the client cancelled or stopped reading until its
    // deadline) did not deliver everything, whatever the job's own outcome.
    if (broken_ && final_status_.ok()) final_status_ = cancel_reason(*context_);
    const double seconds = seconds_since(arrival_);
    record_finished_request(service_.host().metrics(), "GenerateImageStream", request_id_,
                            final_status_, seconds, context_->peer(),
                            job_ ? &job_->spec() : nullptr);
    const grpc::Status status = to_grpc_status(final_status_);
    lock.unlock();
    Finish(status);
  }

  ImageGenerationService& service_;
  grpc::CallbackServerContext* context_;
  const Clock::time_point arrival_;
  std::string request_id_;
  std::shared_ptr<const ServingModel> model_;
  std::shared_ptr<Job> job_;

  std::mutex mu_;
  std::deque<v1::GenerateImageStreamResponse> pending_;  // guarded by mu_
  grpc::ByteBuffer current_;                             // the write in progress, serialized
  bool writing_ = false;                                 // guarded by mu_
  bool finishing_ = false;                               // guarded by mu_: the job is over
  bool finished_ = false;                                // guarded by mu_: Finish was called
  bool broken_ = false;        // guarded by mu_: a write failed or the call was cancelled
  absl::Status final_status_;  // guarded by mu_
};

}  // namespace

ImageGenerationService::ImageGenerationService(GenerationHost& host) : host_(host) {}

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
  return check_bearer_token(host_.auth_token(), values);
}

absl::StatusOr<std::shared_ptr<Job>> ImageGenerationService::make_job(
    grpc::CallbackServerContext* context, const v1::GenerateImageRequest& request,
    Clock::time_point arrival, Job::ProgressCallback on_progress, Job::DoneCallback on_done,
    std::shared_ptr<const ServingModel>* model) {
  FLUX_RETURN_IF_ERROR(authenticate(*context));
  return create_job(host_, request, arrival, steady_deadline(*context), std::move(on_progress),
                    std::move(on_done), model);
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
  v1::GetModelInfoResponse model_info;
  v1::GetModelInfoResponse* response = &model_info;
  absl::Status status = parse_message(*raw_request, &request);
  if (status.ok()) status = authenticate(*context);
  absl::StatusOr<std::shared_ptr<const ServingModel>> serving = host_.serving_model();
  if (status.ok()) status = serving.status();
  if (status.ok()) {
    const ServingModel& model = **serving;
    const PipelineInfo& info = model.info;
    response->set_model_name(info.model_name);
    response->set_variant(info.variant);
    response->set_pipeline_class(info.pipeline_class);
    response->set_backend(info.backend);
    response->set_default_steps(static_cast<int32_t>(info.default_steps));
    response->set_default_guidance(info.default_guidance);
    response->set_uses_cfg(info.uses_cfg);
    response->set_guidance_embedded(info.guidance_embedded);
    v1::Limits* limits = response->mutable_limits();
    limits->set_pixel_multiple(static_cast<int32_t>(model.limits.pixel_multiple));
    limits->set_max_pixels(model.limits.max_pixels);
    limits->set_max_steps(static_cast<int32_t>(model.limits.max_steps));
    limits->set_min_guidance(model.limits.min_guidance);
    limits->set_max_guidance(model.limits.max_guidance);
    limits->set_max_images(static_cast<int32_t>(model.limits.max_images));
    limits->set_max_prompt_bytes(static_cast<int32_t>(model.limits.max_prompt_bytes));
    limits->set_max_sequence_length(static_cast<int32_t>(model.limits.max_sequence_length));
    limits->set_queue_depth(model.queue_depth);
    limits->set_max_reference_images(static_cast<int32_t>(model.limits.max_reference_images));
    limits->set_max_reference_bytes(model.limits.max_reference_bytes);
    limits->set_max_request_bytes(model.limits.max_request_bytes);
    limits->set_max_response_bytes(model.limits.max_response_bytes);
    response->add_quality_levels(v1::QUALITY_LOSSLESS);
    if (model.limits.quality_high_enabled) response->add_quality_levels(v1::QUALITY_HIGH);
    response->add_output_formats(v1::OUTPUT_FORMAT_PNG);
    response->add_output_formats(v1::OUTPUT_FORMAT_JPEG);
    response->add_output_formats(v1::OUTPUT_FORMAT_WEBP);
    for (const FastPathCounters& path : fast_path_snapshot()) response->add_fast_paths(path.path);
    response->set_fast_paths_enabled(model.limits.fast_paths);
    for (const auto& [flag, value] : model.backend_options.describe()) {
      (*response->mutable_backend_options())[flag] = value;
    }
    response->set_server_version(FLUX2_VERSION);
    response->set_weight_bytes(info.device_bytes);
    response->set_text_encoder_streamed(info.text_encoder_streamed);
    response->set_text_encoder_host_bytes(info.text_encoder_host_bytes);
    response->set_prompt_cache_bytes(info.prompt_cache_bytes);
    response->set_transformer_file(model.transformer_file);
    response->set_http_port(model.http_port);
    response->set_stall_timeout_min_seconds(model.stall.min_seconds);
    response->set_stall_step_multiple(model.stall.step_multiple);
    response->set_test_inject_fault(model.test_inject_fault);
  }
  if (status.ok()) status = serialize_message(model_info, raw_response);
  host_.metrics().count_request("GetModelInfo", status_code_name(status), seconds_since(arrival));
  reactor->Finish(to_grpc_status(status));
  return reactor;
}

void set_image_metadata(const EncodedImage& image, v1::Image* out) {
  out->set_mime_type(std::string(image_mime_type(image.format)));
  out->set_width(static_cast<int32_t>(image.width));
  out->set_height(static_cast<int32_t>(image.height));
  out->set_seed(image.seed);
}

void fill_generate_response(const JobSpec& spec, JobResult&& result, const ServingModel& model,
                            Clock::time_point arrival, v1::GenerateImageResponse* response) {
  for (EncodedImage& image : result.images) {
    v1::Image* out = response->add_images();
    out->set_data(std::string(image.bytes.begin(), image.bytes.end()));
    set_image_metadata(image, out);
  }
  response->set_seed(spec.params.seed);
  const WorkerReport& report = result.report;
  v1::Timings* timings = response->mutable_timings();
  timings->set_queue_seconds(report.queue_seconds);
  timings->set_tokenize_seconds(report.tokenize_seconds);
  timings->set_text_encode_seconds(report.text_encode_seconds);
  timings->set_reference_encode_seconds(report.reference_encode_seconds);
  timings->set_denoise_seconds(report.denoise_seconds);
  for (double step : report.step_seconds) timings->add_step_seconds(step);
  timings->set_decode_seconds(report.decode_seconds);
  timings->set_encode_seconds(result.encode_seconds);
  timings->set_total_seconds(seconds_since(arrival));
  int64_t fallbacks = 0;
  for (const FastPathCounters& path : report.fast_paths) {
    v1::FastPathUsage* usage = response->add_fast_paths();
    usage->set_path(path.path);
    usage->set_invocations(path.invocations);
    for (const auto& [reason, count] : path.fallbacks) {
      (*usage->mutable_fallbacks())[reason] = count;
      fallbacks += count;
    }
  }
  response->set_fast_path_fallbacks(fallbacks);
  response->set_model_name(model.info.model_name);
  response->set_request_id(spec.request_id);
  response->set_quality(to_proto(spec.params.quality));
}

}  // namespace flux2::server
