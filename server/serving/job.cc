// Job state machine and cancellation; see job.h.
// Tested by tests/server/job_queue_test.cc and tests/server/engine_worker_test.cc.
#include "server/serving/job.h"

#include "server/serving/job_events.h"

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

Job::Job(JobSpec spec, Clock::time_point arrival, Clock::time_point deadline,
         std::shared_ptr<JobEvents> events)
    : spec_(std::move(spec)), arrival_(arrival), deadline_(deadline), events_(std::move(events)) {}

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
  }
  // Outside the lock: the front end's wake-up may hand the outcome to gRPC, which may call back
  // into cancel(). No progress or image event can follow: they are pushed only while kRunning.
  if (before_done_) before_done_();
  if (events_) {
    JobEvent done;
    done.kind = JobEvent::Kind::kDone;
    done.status = status;
    done.result = std::move(result);
    events_->push(std::move(done));
  }
  if (on_finished_) on_finished_();
  return true;
}

void Job::report_progress(const ProgressEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  // Under the lock so that no event can follow finish(); the push only queues it.
  if (state_ != JobState::kRunning || !events_ || !events_->wants().progress) return;
  JobEvent progress;
  progress.progress = event;
  events_->push(std::move(progress));
}

void Job::report_image(EncodedImage& image, int image_index) {
  std::lock_guard<std::mutex> lock(mu_);
  // As report_progress: under the lock so that no image can follow finish().
  if (state_ != JobState::kRunning || !events_ || !events_->wants().images) return;
  JobEvent encoded;
  encoded.kind = JobEvent::Kind::kImage;
  encoded.image.bytes.swap(image.bytes);  // sent in the event; the result keeps the rest
  encoded.image.format = image.format;
  encoded.image.width = image.width;
  encoded.image.height = image.height;
  encoded.image.seed = image.seed;
  encoded.image_index = image_index;
  events_->push(std::move(encoded));
}

}  // namespace flux2::server
