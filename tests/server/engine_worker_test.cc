// The engine worker and the encoder thread (server/serving/engine_worker.h,
// server/serving/encode_stage.h) with the fake engine: warm-up before serving, generation +
// PNG/JPEG encoding, progress events, seeds seed + i, cancellation while queued and between steps,
// deadlines, and encoding off the worker's critical path. Orderings only: the fake engine's steps
// wait at a gate the test opens. Run: build/bin/server_unit_tests --gtest_filter='EngineWorker*'
#include "server/serving/engine_worker.h"

#include <stb_image.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "tests/server/fake_engine.h"
#include "tests/server/job_callbacks.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

using testing::fake_engine_factory;
using testing::fake_pixel;
using testing::FakeEngineControl;
using testing::kFakeReferenceEncodeSeconds;
using testing::metric_value;

constexpr auto kLimit = std::chrono::seconds(60);

// Collects one job's progress and outcome.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  JobResult result;
  std::vector<ProgressEvent> events;
  std::function<void()> in_done;  // runs inside the done callback (encoder thread)

  std::shared_ptr<Job> make(JobSpec spec, Clock::time_point deadline = Clock::time_point::max()) {
    return std::make_shared<Job>(std::move(spec), Clock::now(), deadline,
                                 testing::callback_events(
                                     [this](const ProgressEvent& event) {
                                       std::lock_guard<std::mutex> lock(mu);
                                       events.push_back(event);
                                     },
                                     [this](const absl::Status& s, JobResult&& r) {
                                       if (in_done) in_done();
                                       std::lock_guard<std::mutex> lock(mu);
                                       done = true;
                                       status = s;
                                       result = std::move(r);
                                       cv.notify_all();
                                     }));
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kLimit, [this] { return done; });
  }
};

JobSpec spec(uint64_t seed, int steps, int num_images = 1, ImageFormat format = ImageFormat::kPng) {
  JobSpec s;
  s.params.prompt = "a fox";
  s.params.width = 64;
  s.params.height = 48;
  s.params.num_inference_steps = steps;
  s.params.seed = seed;
  s.num_images = num_images;
  s.format = format;
  return s;
}

// Decodes an encoded image and checks it against the fake engine's pixels for `seed`.
void expect_fake_pixels(const EncodedImage& image, uint64_t seed) {
  int w = 0, h = 0, channels = 0;
  stbi_uc* pixels = stbi_load_from_memory(image.bytes.data(), static_cast<int>(image.bytes.size()),
                                          &w, &h, &channels, 3);
  ASSERT_NE(pixels, nullptr) << stbi_failure_reason();
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 48);
  int mismatches = 0;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c)
        mismatches += pixels[(y * w + x) * 3 + c] != fake_pixel(seed, x, y, c);
    }
  }
  EXPECT_EQ(mismatches, 0);  // PNG is lossless
  stbi_image_free(pixels);
}

class EngineWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override { control_ = std::make_shared<FakeEngineControl>(); }

  void start(int warmup_steps = 0, bool warmup_reference = false) {
    queue_ = std::make_unique<JobQueue>(8, [this](int depth) { metrics_.set_queue_depth(depth); });
    encoder_ = std::make_unique<EncodeStage>(metrics_);
    encoder_->start();
    WorkerOptions options;
    options.warmup_steps = warmup_steps;
    options.warmup_reference = warmup_reference;
    worker_ = std::make_unique<EngineWorker>(
        fake_engine_factory(control_), *queue_, *encoder_, metrics_, options,
        [this](WorkerPhase phase, const absl::Status& status) {
          std::lock_guard<std::mutex> lock(mu_);
          phases_.push_back(phase);
          if (phase == WorkerPhase::kServing) generations_when_serving_ = control_->generations();
          phase_status_ = status;
          cv_.notify_all();
        });
    worker_->start();
  }

  bool wait_phase(WorkerPhase phase) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kLimit, [&] {
      return std::find(phases_.begin(), phases_.end(), phase) != phases_.end();
    });
  }

  void TearDown() override {
    control_->open_gate();
    control_->release_load();
    if (queue_) queue_->close();
    if (worker_) {
      EXPECT_TRUE(worker_->join_until(Clock::now() + kLimit));
    }
    if (encoder_) encoder_->stop();
  }

  std::shared_ptr<FakeEngineControl> control_;
  Metrics metrics_;
  std::unique_ptr<JobQueue> queue_;
  std::unique_ptr<EncodeStage> encoder_;
  std::unique_ptr<EngineWorker> worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WorkerPhase> phases_;
  int generations_when_serving_ = -1;
  absl::Status phase_status_;
};

TEST_F(EngineWorkerTest, WarmsUpBeforeServing) {
  start(/*warmup_steps=*/2);
  ASSERT_TRUE(wait_phase(WorkerPhase::kServing));
  EXPECT_EQ(generations_when_serving_, 1);
  EXPECT_EQ(control_->steps_started(), 2);
  EXPECT_EQ(control_->seeds(), (std::vector<uint64_t>{0}));
  EXPECT_NE(worker_->engine(), nullptr);
  // The warm-up is not a request: no step or request metrics.
  EXPECT_EQ(metric_value(metrics_.render(), "flux2_denoise_step_duration_seconds_count"), 0.0);
}

TEST_F(EngineWorkerTest, WarmUpRunsWithAReferenceWhenEditingIsOn) {
  start(/*warmup_steps=*/1, /*warmup_reference=*/true);
  ASSERT_TRUE(wait_phase(WorkerPhase::kServing));
  EXPECT_EQ(generations_when_serving_, 2);
  const std::vector<std::vector<RgbImage>> references = control_->references();
  ASSERT_EQ(references.size(), 2u);
  EXPECT_TRUE(references[0].empty());  // text-to-image first
  ASSERT_EQ(references[1].size(), 1u);
  // A prepared reference of the warm-up size (16 x 16 latent tokens on the CPU).
  EXPECT_EQ(references[1][0].width, 256);
  EXPECT_EQ(references[1][0].height, 256);
  EXPECT_EQ(references[1][0].pixels.size(), 256u * 256u * 3u);
}

TEST_F(EngineWorkerTest, NoWarmupWhenZeroSteps) {
  start(/*warmup_steps=*/0);
  ASSERT_TRUE(wait_phase(WorkerPhase::kServing));
  EXPECT_EQ(generations_when_serving_, 0);
}

TEST_F(EngineWorkerTest, LoadFailureEndsInFailedPhase) {
  control_->fail_load(absl::NotFoundError("no weights"));
  start();
  ASSERT_TRUE(wait_phase(WorkerPhase::kFailed));
  EXPECT_TRUE(absl::IsNotFound(phase_status_));
  EXPECT_EQ(worker_->engine(), nullptr);
}

TEST_F(EngineWorkerTest, GeneratesEncodesAndReportsEveryStep) {
  start();
  Recorder r;
  auto job = r.make(spec(/*seed=*/10, /*steps=*/3, /*num_images=*/2));
  ASSERT_TRUE(queue_->push(job).ok());
  ASSERT_TRUE(r.wait());
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(job->state(), JobState::kSucceeded);
  ASSERT_EQ(r.result.images.size(), 2u);
  EXPECT_EQ(r.result.images[0].seed, 10u);  // image i uses seed + i
  EXPECT_EQ(r.result.images[1].seed, 11u);
  expect_fake_pixels(r.result.images[0], 10);
  expect_fake_pixels(r.result.images[1], 11);
  EXPECT_EQ(control_->seeds(), (std::vector<uint64_t>{10, 11}));
  ASSERT_EQ(r.events.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r.events[i].image_index, i / 3);
    EXPECT_EQ(r.events[i].step_index, i % 3);
    EXPECT_EQ(r.events[i].step_count, 3);
    EXPECT_EQ(r.events[i].num_images, 2);
    if (i > 0) {
      EXPECT_GE(r.events[i].elapsed_seconds, r.events[i - 1].elapsed_seconds);
    }
  }
  EXPECT_EQ(r.result.report.step_seconds.size(), 6u);
  EXPECT_GT(r.result.report.denoise_seconds, 0.0);
  EXPECT_GT(r.result.report.text_encode_seconds, 0.0);
  EXPECT_GE(r.result.report.queue_seconds, 0.0);
  const std::string text = metrics_.render();
  EXPECT_EQ(
      metric_value(text, "flux2_denoise_step_duration_seconds_count", {{"quality", "lossless"}}),
      6.0);
  EXPECT_EQ(metric_value(text, "flux2_images_generated_total"), 2.0);
  EXPECT_EQ(metric_value(text, "flux2_pixels_generated_total"), 2.0 * 64 * 48);
  EXPECT_EQ(metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "encode"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "denoise"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_queue_duration_seconds_count"), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_requests_in_flight"), 0.0);
  EXPECT_EQ(metric_value(text, "flux2_queue_depth"), 0.0);
  // Text-to-image: no reference stage, no reference counted.
  EXPECT_EQ(r.result.report.reference_encode_seconds, 0.0);
  EXPECT_EQ(
      metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "reference_encode"}}),
      0.0);
  EXPECT_EQ(metric_value(text, "flux2_reference_images_total"), 0.0);
}

TEST_F(EngineWorkerTest, ReferencesReachTheEngineAndAreTimedAndCounted) {
  start();
  Recorder r;
  JobSpec s = spec(/*seed=*/5, /*steps=*/1, /*num_images=*/2);
  for (int64_t side : {64, 80}) {
    s.params.references.push_back(
        RgbImage{side, 64, std::vector<uint8_t>(static_cast<size_t>(side * 64 * 3), uint8_t{7})});
  }
  ASSERT_TRUE(queue_->push(r.make(std::move(s))).ok());
  ASSERT_TRUE(r.wait());
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<std::vector<RgbImage>> seen = control_->references();
  ASSERT_EQ(seen.size(), 2u);  // both images were generated with both references
  for (const std::vector<RgbImage>& references : seen) {
    ASSERT_EQ(references.size(), 2u);
    EXPECT_EQ(references[1].width, 80);
  }
  // Summed over the images, like the other stages.
  EXPECT_DOUBLE_EQ(r.result.report.reference_encode_seconds, 2 * 2 * kFakeReferenceEncodeSeconds);
  const std::string text = metrics_.render();
  EXPECT_EQ(
      metric_value(text, "flux2_stage_duration_seconds_count", {{"stage", "reference_encode"}}),
      1.0);
  EXPECT_DOUBLE_EQ(
      *metric_value(text, "flux2_stage_duration_seconds_sum", {{"stage", "reference_encode"}}),
      2 * 2 * kFakeReferenceEncodeSeconds);
  EXPECT_EQ(metric_value(text, "flux2_reference_images_total"), 2.0);  // per request, not image
}

// One count per request that generated, from its first image: a 2-image request of a new prompt
// is one miss (its second image's hit is not counted), the same prompt again one hit.
TEST_F(EngineWorkerTest, PromptCacheHitsAndMissesAreCountedPerRequest) {
  start();
  const auto run = [this](JobSpec s) {
    Recorder r;
    EXPECT_TRUE(queue_->push(r.make(std::move(s))).ok());
    EXPECT_TRUE(r.wait());
    EXPECT_TRUE(r.status.ok()) << r.status;
    return r.result.report.prompt_cache_hit;
  };
  EXPECT_FALSE(run(spec(/*seed=*/1, /*steps=*/1, /*num_images=*/2)));
  EXPECT_TRUE(run(spec(/*seed=*/2, /*steps=*/1)));
  JobSpec other = spec(/*seed=*/3, /*steps=*/1);
  other.params.prompt = "a hare";
  EXPECT_FALSE(run(std::move(other)));
  const std::string text = metrics_.render();
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "hit"}}), 1.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "miss"}}), 2.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_capacity_bytes"),
            static_cast<double>(kDefaultPromptCacheBytes));
}

TEST_F(EngineWorkerTest, WithThePromptCacheOffEveryRequestIsAMiss) {
  control_->prompt_cache_bytes = 0;
  start();
  for (uint64_t seed : {1, 2}) {
    Recorder r;
    ASSERT_TRUE(queue_->push(r.make(spec(seed, /*steps=*/1))).ok());
    ASSERT_TRUE(r.wait());
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  const std::string text = metrics_.render();
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "hit"}}), 0.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_requests_total", {{"result", "miss"}}), 2.0);
  EXPECT_EQ(metric_value(text, "flux2_prompt_cache_capacity_bytes"), 0.0);
}

TEST_F(EngineWorkerTest, EncodesJpeg) {
  start();
  Recorder r;
  ASSERT_TRUE(queue_->push(r.make(spec(3, 1, 1, ImageFormat::kJpeg))).ok());
  ASSERT_TRUE(r.wait());
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.result.images.size(), 1u);
  const std::vector<uint8_t>& bytes = r.result.images[0].bytes;
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(bytes[0], 0xFF);  // JPEG SOI marker
  EXPECT_EQ(bytes[1], 0xD8);
  int w = 0, h = 0, channels = 0;
  stbi_uc* pixels =
      stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &channels, 3);
  ASSERT_NE(pixels, nullptr);
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 48);
  stbi_image_free(pixels);
}

TEST_F(EngineWorkerTest, JobCancelledWhileQueuedNeverRuns) {
  control_->close_gate();
  start();
  Recorder a, b;
  auto job_a = a.make(spec(1, 5));
  auto job_b = b.make(spec(2, 5));
  ASSERT_TRUE(queue_->push(job_a).ok());
  ASSERT_TRUE(control_->wait_steps_started(0));
  ASSERT_TRUE(queue_->push(job_b).ok());
  control_->allow_steps(1);
  ASSERT_TRUE(control_->wait_steps_started(1));  // A is running, B waits
  EXPECT_EQ(job_a->state(), JobState::kRunning);
  EXPECT_EQ(job_b->state(), JobState::kQueued);
  // What Server::withdraw does for a cancelled call.
  job_b->cancel(absl::CancelledError("client"));
  ASSERT_TRUE(queue_->remove(job_b.get()));
  job_b->finish(absl::CancelledError("client"));
  ASSERT_TRUE(b.wait());
  EXPECT_TRUE(absl::IsCancelled(b.status));
  EXPECT_EQ(job_b->state(), JobState::kCancelled);
  control_->open_gate();
  ASSERT_TRUE(a.wait());
  EXPECT_TRUE(a.status.ok());
  EXPECT_EQ(control_->generations(), 1);  // B never reached the engine
}

TEST_F(EngineWorkerTest, CancelMidRunFreesTheWorkerWithinOneStep) {
  control_->close_gate();
  start();
  Recorder a, b;
  auto job_a = a.make(spec(1, /*steps=*/100));
  auto job_b = b.make(spec(2, /*steps=*/2));
  ASSERT_TRUE(queue_->push(job_a).ok());
  ASSERT_TRUE(queue_->push(job_b).ok());
  control_->allow_steps(3);
  ASSERT_TRUE(control_->wait_steps_started(3));
  const int started_at_cancel = control_->steps_started();
  job_a->cancel(absl::CancelledError("client"));
  control_->open_gate();
  ASSERT_TRUE(a.wait());
  EXPECT_TRUE(absl::IsCancelled(a.status)) << a.status;
  EXPECT_EQ(job_a->state(), JobState::kCancelled);
  ASSERT_TRUE(b.wait());
  EXPECT_TRUE(b.status.ok()) << b.status;
  // A may finish the step it is in, plus one that passed its check before the cancel; never more.
  const int a_steps = control_->steps_started() - 2;
  EXPECT_LE(a_steps, started_at_cancel + 1);
  EXPECT_LT(a_steps, 100);
}

TEST_F(EngineWorkerTest, DeadlinePassingBetweenStepsStopsTheJob) {
  control_->close_gate();
  start();
  Recorder a;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(50);
  auto job = a.make(spec(1, 100), deadline);
  ASSERT_TRUE(queue_->push(job).ok());
  control_->allow_steps(1);
  ASSERT_TRUE(control_->wait_steps_started(1));
  std::this_thread::sleep_until(deadline + std::chrono::milliseconds(10));  // let the deadline pass
  control_->open_gate();
  ASSERT_TRUE(a.wait());
  EXPECT_TRUE(absl::IsDeadlineExceeded(a.status)) << a.status;
  EXPECT_LT(control_->steps_started(), 100);
}

TEST_F(EngineWorkerTest, DeadlineExpiredInTheQueueSkipsGeneration) {
  start();
  Recorder a;
  ASSERT_TRUE(queue_->push(a.make(spec(1, 4), Clock::now() - std::chrono::milliseconds(1))).ok());
  ASSERT_TRUE(a.wait());
  EXPECT_TRUE(absl::IsDeadlineExceeded(a.status));
  EXPECT_EQ(control_->generations(), 0);
}

TEST_F(EngineWorkerTest, EncodingDoesNotHoldUpTheNextJob) {
  start();
  Recorder a, b;
  // A's completion runs on the encoder thread; it waits until the worker has begun B. If the
  // worker encoded (or completed) A itself, B could not begin and this would report false.
  bool b_began_before_a_completed = false;
  a.in_done = [&] { b_began_before_a_completed = control_->wait_generations(2); };
  ASSERT_TRUE(queue_->push(a.make(spec(1, 2))).ok());
  ASSERT_TRUE(queue_->push(b.make(spec(2, 2))).ok());
  ASSERT_TRUE(a.wait());
  ASSERT_TRUE(b.wait());
  EXPECT_TRUE(b_began_before_a_completed);
  EXPECT_TRUE(a.status.ok());
  EXPECT_TRUE(b.status.ok());
}

}  // namespace
}  // namespace flux2::server
