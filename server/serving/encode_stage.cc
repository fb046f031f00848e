// The PNG/JPEG encoder thread; see encode_stage.h. Tested by tests/server/engine_worker_test.cc.
#include "server/serving/encode_stage.h"

#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "model/image_encode.h"

namespace flux2::server {

EncodeStage::EncodeStage(Metrics& metrics) : metrics_(metrics) {}

EncodeStage::~EncodeStage() {
  stop();
}

void EncodeStage::start() {
  thread_ = std::thread([this] { run(); });
}

void EncodeStage::encode(std::shared_ptr<Job> job, GeneratedImage image) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(Task{std::move(job), false, std::move(image), absl::OkStatus(), {}});
  }
  cv_.notify_one();
}

void EncodeStage::finish(std::shared_ptr<Job> job, absl::Status status, WorkerReport report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(Task{std::move(job), true, {}, std::move(status), std::move(report)});
  }
  cv_.notify_one();
}

void EncodeStage::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EncodeStage::run() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !tasks_.empty() || stopping_; });
      if (tasks_.empty()) return;  // stopping and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    if (task.is_finish) {
      run_finish(task);
    } else {
      run_encode(task);
    }
  }
}

void EncodeStage::run_encode(Task& task) {
  Job& job = *task.job;
  // A job that failed or was cancelled meanwhile is not worth encoding; its finish task follows.
  if (job.state() != JobState::kRunning) return;
  // Nobody waits for an image whose client hung up or whose deadline passed (during the decode,
  // say): no encode, and the request ends as the client saw it.
  if (absl::Status status = job.check_continue(); !status.ok()) {
    job.finish(status);
    return;
  }
  const Clock::time_point start = Clock::now();
  const GeneratedImage& image = task.image;
  const std::span<const uint8_t> rgb(image.rgb);
  const JobSpec& spec = job.spec();
  absl::StatusOr<std::vector<uint8_t>> bytes =
      spec.format == ImageFormat::kJpeg
          ? encode_jpeg(rgb, image.width, image.height, spec.encoder_quality)
      : spec.format == ImageFormat::kWebp
          ? encode_webp(rgb, image.width, image.height, spec.encoder_quality)
          : encode_png(rgb, image.width, image.height);
  job.encode_seconds() += seconds_since(start);
  if (!bytes.ok()) {
    job.finish(
        absl::InternalError(absl::StrCat("encoding the image failed: ", bytes.status().message())));
    return;
  }
  job.encoded_images().push_back(
      EncodedImage{std::move(*bytes), job.spec().format, image.width, image.height, image.seed});
  job.report_image(job.encoded_images().back(), static_cast<int>(job.encoded_images().size()) - 1);
}

void EncodeStage::run_finish(Task& task) {
  Job& job = *task.job;
  if (!task.status.ok()) {
    job.finish(task.status);
    return;
  }
  if (job.state() != JobState::kRunning) return;  // an encoding error already finished it
  // The last stage boundary: a cancel or deadline during the encode is what the client saw.
  if (absl::Status status = job.check_continue(); !status.ok()) {
    job.finish(status);
    return;
  }
  if (static_cast<int>(job.encoded_images().size()) != job.spec().num_images) {
    job.finish(absl::InternalError("an image was not encoded"));  // only after a failed encode
    return;
  }
  JobResult result;
  result.report = std::move(task.report);
  result.images = std::move(job.encoded_images());
  result.encode_seconds = job.encode_seconds();
  int64_t pixels = 0;
  for (const EncodedImage& image : result.images) pixels += image.width * image.height;
  // Metrics first: the reply unblocks the client, which may read /metrics at once. Only this
  // thread finishes running jobs, so the finish below cannot be preempted.
  metrics_.observe_stage(Stage::kEncode, result.encode_seconds);
  metrics_.count_images(static_cast<int64_t>(result.images.size()), pixels);
  metrics_.count_reference_images(static_cast<int64_t>(job.spec().params.references.size()));
  job.finish(absl::OkStatus(), std::move(result));
}

}  // namespace flux2::server
