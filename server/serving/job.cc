// Job state machine and cancellation; see job.h.
// Tested by tests/server/job_queue_test.cc and tests/server/engine_worker_test.cc.
#include "server/serving/job.h"

#include <utility>

namespace flux2::server {

absl::string_view job_state_name(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "queued";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

absl::string_view image_mime_type(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "image/png";
    case ImageFormat::kJpeg:
      return "image/jpeg";
    case ImageFormat::kWebp:
      return "image/webp";
  }
  return "application/octet-stream";
}

absl::string_view image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kWebp:
      return "WebP";
  }
  return "image";
}

Job::Job(JobSpec spec, Clock::time_point arrival, Clock::time_point deadline,
         ProgressCallback on_progress, DoneCallback on_done)
    : spec_(std::move(spec)),
      arrival_(arrival),
      deadline_(deadline),
      on_progress_(std::move(on_progress)),
      on_done_(std::move(on_done)) {}

void Job::cancel(absl::Status reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancel_reason_.ok() && !reason.ok()) cancel_reason_ = std::move(reason);
}

absl::Status Job::check_continue() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cancel_reason_.ok()) return cancel_reason_;
  }
  if (Clock::now() >= deadline_) {
    return absl::DeadlineExceededError("the request deadline passed before the image was done");
  }
  return absl::OkStatus();
}

JobState Job::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

bool Job::start_running() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != JobState::kQueued) return false;
  state_ = JobState::kRunning;
  return true;
}

bool Job::finish(const absl::Status& status, JobResult&& result) {
  DoneCallback done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != JobState::kQueued && state_ != JobState::kRunning) return false;
    if (status.ok()) {
      state_ = JobState::kSucceeded;
    } else if (absl::IsCancelled(status) || absl::IsDeadlineExceeded(status)) {
      state_ = JobState::kCancelled;
    } else {
      state_ = JobState::kFailed;
    }
    done = std::move(on_done_);
    on_progress_ = nullptr;
    on_image_ = nullptr;
  }
  // Outside the lock: the callback hands the outcome to gRPC, which may call back into cancel().
  if (done) done(status, std::move(result));
  if (on_finished_) on_finished_();
  return true;
}

void Job::report_progress(const ProgressEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  // Under the lock so that no event can follow finish(); the callback only queues a write.
  if (state_ == JobState::kRunning && on_progress_) on_progress_(event);
}

void Job::report_image(EncodedImage& image) {
  std::lock_guard<std::mutex> lock(mu_);
  // As report_progress: under the lock so that no image can follow finish().
  if (state_ == JobState::kRunning && on_image_) on_image_(image);
}

}  // namespace flux2::server
