// One admitted generation request as the worker and the encoder see it: its validated spec, its
// deadline and cancellation flag, its state machine and the callbacks that report progress and the
// final outcome to the RPC layer (exactly once). Tested by tests/server/job_queue_test.cc and
// tests/server/engine_worker_test.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/base/fast_path_registry.h"
#include "model/pipeline.h"
#include "server/serving/request.h"

namespace flux2::server {

using Clock = std::chrono::steady_clock;

// Lifecycle of a job. Transitions: kQueued -> kRunning -> one terminal state, or
// kQueued -> kCancelled / kFailed when it never reaches the worker.
enum class JobState : uint8_t {
  kQueued,     // admitted to the bounded queue, waiting for the worker
  kRunning,    // taken by the worker: generating, or waiting for / in the PNG/JPEG encoder
  kSucceeded,  // every image generated and encoded; the response went to the RPC layer
  kFailed,     // the engine or the encoder returned an error, or the server stopped before it ran
  kCancelled,  // the client cancelled or the deadline passed (while queued or between steps)
};

absl::string_view job_state_name(JobState state);

// JPEG and WebP encoder quality (1..100) when the request names none: visually lossless for
// generated images.
constexpr int kDefaultEncoderQuality = 95;

// An adapter a request applied, as the response reports it.
struct AppliedLora {
  std::string name;
  double scale = 1.0;
  std::string layout;  // lora_layout_name()
  int64_t max_rank = 0;
  std::string sha256_prefix;  // 12 hex digits of the file's SHA-256
};

// A validated request (validate() in server/serving/validate.h builds it from a GenerateRequest).
struct JobSpec {
  // params.seed is the first image's seed; image i uses seed + i. params.width / height are the
  // output size (never 0); params.references are decoded and prepared.
  GenerateParams params;
  int num_images = 1;
  ImageFormat format = ImageFormat::kPng;
  int encoder_quality = kDefaultEncoderQuality;  // JPEG and WebP only
  std::string request_id;
  // The adapters of params.loras, in order (filled by ServingCore::create_job).
  std::vector<AppliedLora> loras;
};

// Sent to the RPC layer after every denoising step.
struct ProgressEvent {
  int step_index = 0;            // 0-based step that finished
  int step_count = 0;            // steps per image
  double step_seconds = 0.0;     // that step's duration
  double elapsed_seconds = 0.0;  // since the request arrived
  int image_index = 0;           // image being generated, 0-based
  int num_images = 1;
  StepCacheCounts cache;  // this image's step caching so far
};

struct EncodedImage {
  std::vector<uint8_t> bytes;
  ImageFormat format = ImageFormat::kPng;
  int64_t width = 0;
  int64_t height = 0;
  uint64_t seed = 0;
};

// What the worker measured for one job (sums over its images).
struct WorkerReport {
  double queue_seconds = 0.0;
  double tokenize_seconds = 0.0;
  double text_encode_seconds = 0.0;
  double reference_encode_seconds = 0.0;  // 0 without references
  double denoise_seconds = 0.0;
  std::vector<double> step_seconds;  // every step of every image, in order
  double decode_seconds = 0.0;
  std::vector<FastPathCounters> fast_paths;  // activity during this job (deltas), active paths only
  // The first image's prompt embeddings came from the prompt cache (GeneratedImage::
  // prompt_cache_hit); later images of the job reuse its prompt, so they say nothing more.
  bool prompt_cache_hit = false;
  StepCacheCounts cache;           // summed over the images
  std::vector<float> cache_diffs;  // every diff step caching computed (the metrics' histogram)
};

// The outcome handed to the RPC layer on success.
struct JobResult {
  WorkerReport report;
  std::vector<EncodedImage> images;  // in seed order
  double encode_seconds = 0.0;
};

class JobEvents;  // server/serving/job_events.h

class Job {
 public:
  // `deadline` is Clock::time_point::max() when the call has none. `events` (may be null: tests
  // that only watch the state) hears the job's progress, images and end, as events->wants() says.
  Job(JobSpec spec, Clock::time_point arrival, Clock::time_point deadline,
      std::shared_ptr<JobEvents> events);

  const JobSpec& spec() const { return spec_; }
  Clock::time_point arrival() const { return arrival_; }
  Clock::time_point deadline() const { return deadline_; }

  // Asks the job to stop with `reason` (Cancelled, DeadlineExceeded or Unavailable); the first
  // reason wins. Thread-safe; the worker notices at its next check_continue().
  void cancel(absl::Status reason);
  // OK while the job may go on; else the cancellation reason, or DeadlineExceeded once the
  // deadline has passed.
  absl::Status check_continue() const;

  JobState state() const;
  // kQueued -> kRunning. False when the job already reached a terminal state.
  bool start_running();
  // Moves to the terminal state matching `status` and pushes the `done` event. Only the first
  // call has any effect; returns whether it was this one.
  bool finish(const absl::Status& status, JobResult&& result = {});
  // Called after the done event by finish() (the server counts outstanding jobs with it). Set
  // before the job is shared with other threads.
  void set_on_finished(std::function<void()> on_finished) { on_finished_ = std::move(on_finished); }
  // Called by finish() just before the done event: the server brings the metrics that depend on
  // the outcome up to date, so a client that saw the response sees them too. Set before the job
  // is shared with other threads.
  void set_before_done(std::function<void()> before_done) { before_done_ = std::move(before_done); }
  // Pushes a progress event when the front end wants them, unless the job already finished.
  void report_progress(const ProgressEvent& event);
  // A freshly encoded image: when the front end wants images one by one, its bytes move into an
  // image event (the result keeps the metadata); unless the job already finished.
  void report_image(EncodedImage& image, int image_index);

  // Images encoded so far; touched only by the encoder thread.
  std::vector<EncodedImage>& encoded_images() { return encoded_; }
  double& encode_seconds() { return encode_seconds_; }

 private:
  const JobSpec spec_;
  const Clock::time_point arrival_;
  const Clock::time_point deadline_;
  const std::shared_ptr<JobEvents> events_;
  std::function<void()> on_finished_;
  std::function<void()> before_done_;

  mutable std::mutex mu_;
  JobState state_ = JobState::kQueued;  // guarded by mu_
  absl::Status cancel_reason_;          // guarded by mu_; OK until cancel()

  std::vector<EncodedImage> encoded_;  // encoder thread only
  double encode_seconds_ = 0.0;        // encoder thread only
};

}  // namespace flux2::server
