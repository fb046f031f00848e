// The admission queue and the job state machine (server/serving/job_queue.h, server/serving/job.h):
// bounded admission, FIFO order, withdrawal, close/drain, the terminal states and exactly-once
// completion. Run: build/bin/server_unit_tests --gtest_filter='JobQueue*:Job.*'
#include "server/serving/job_queue.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/serving/job_events.h"
#include "tests/server/job_callbacks.h"

namespace flux2::server {
namespace {

struct Outcome {
  int calls = 0;
  absl::Status status;
};

std::shared_ptr<Job> make_job(Outcome* outcome,
                              Clock::time_point deadline = Clock::time_point::max()) {
  JobSpec spec;
  spec.params.prompt = "p";
  return std::make_shared<Job>(
      spec, Clock::now(), deadline,
      testing::callback_events(nullptr, [outcome](const absl::Status& status, JobResult&&) {
        ++outcome->calls;
        outcome->status = status;
      }));
}

TEST(JobQueue, AdmitsUpToCapacityThenRejectsAtOnce) {
  std::vector<int> depths;
  JobQueue queue(2, [&depths](int depth) { depths.push_back(depth); });
  Outcome o;
  auto a = make_job(&o), b = make_job(&o), c = make_job(&o);
  EXPECT_TRUE(queue.push(a).ok());
  EXPECT_TRUE(queue.push(b).ok());
  const absl::Status full = queue.push(c);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_EQ(queue.size(), 2);
  EXPECT_EQ(queue.pop(), a);        // FIFO
  EXPECT_TRUE(queue.push(c).ok());  // a slot freed
  EXPECT_EQ(queue.pop(), b);
  EXPECT_EQ(queue.pop(), c);
  EXPECT_EQ(depths, (std::vector<int>{1, 2, 1, 2, 1, 0}));
}

TEST(JobQueue, RemoveFreesTheSlotOfAWaitingJob) {
  JobQueue queue(1);
  Outcome o;
  auto a = make_job(&o), b = make_job(&o);
  ASSERT_TRUE(queue.push(a).ok());
  EXPECT_TRUE(queue.remove(a.get()));
  EXPECT_FALSE(queue.remove(a.get()));  // no longer waiting
  EXPECT_EQ(queue.size(), 0);
  EXPECT_TRUE(queue.push(b).ok());
}

TEST(JobQueue, CloseRefusesNewJobsAndDrainsTheRest) {
  JobQueue queue(4);
  Outcome o;
  auto a = make_job(&o), b = make_job(&o);
  ASSERT_TRUE(queue.push(a).ok());
  queue.close();
  EXPECT_TRUE(queue.closed());
  EXPECT_TRUE(absl::IsUnavailable(queue.push(b)));
  EXPECT_EQ(queue.pop(), a);
  EXPECT_EQ(queue.pop(), nullptr);
}

TEST(JobQueue, PopBlocksUntilAJobOrClose) {
  JobQueue queue(1);
  Outcome o;
  auto a = make_job(&o);
  std::shared_ptr<Job> popped;
  std::thread consumer([&] { popped = queue.pop(); });
  ASSERT_TRUE(queue.push(a).ok());
  consumer.join();
  EXPECT_EQ(popped, a);
  std::thread waiter([&] { popped = queue.pop(); });
  queue.close();
  waiter.join();
  EXPECT_EQ(popped, nullptr);
}

TEST(JobQueue, TakeAllEmptiesTheQueue) {
  JobQueue queue(3);
  Outcome o;
  auto a = make_job(&o), b = make_job(&o);
  ASSERT_TRUE(queue.push(a).ok());
  ASSERT_TRUE(queue.push(b).ok());
  const std::vector<std::shared_ptr<Job>> taken = queue.take_all();
  EXPECT_EQ(taken, (std::vector<std::shared_ptr<Job>>{a, b}));
  EXPECT_EQ(queue.size(), 0);
}

TEST(Job, FinishesExactlyOnceWithTheMatchingState) {
  Outcome o;
  auto job = make_job(&o);
  EXPECT_EQ(job->state(), JobState::kQueued);
  EXPECT_TRUE(job->start_running());
  EXPECT_FALSE(job->start_running());
  EXPECT_EQ(job->state(), JobState::kRunning);
  EXPECT_TRUE(job->finish(absl::OkStatus()));
  EXPECT_FALSE(job->finish(absl::InternalError("late")));
  EXPECT_EQ(job->state(), JobState::kSucceeded);
  EXPECT_EQ(o.calls, 1);
  EXPECT_TRUE(o.status.ok());

  const std::vector<std::pair<absl::Status, JobState>> cases = {
      {absl::CancelledError("c"), JobState::kCancelled},
      {absl::DeadlineExceededError("d"), JobState::kCancelled},
      {absl::InternalError("i"), JobState::kFailed},
      {absl::UnavailableError("u"), JobState::kFailed},
  };
  for (const auto& [status, state] : cases) {
    Outcome other;
    auto queued = make_job(&other);
    EXPECT_TRUE(queued->finish(status));  // straight from kQueued
    EXPECT_EQ(queued->state(), state) << status;
    EXPECT_FALSE(queued->start_running());
    EXPECT_EQ(other.status, status);
  }
  EXPECT_EQ(job_state_name(JobState::kCancelled), "cancelled");
}

TEST(Job, CancelAndDeadlineStopIt) {
  Outcome o;
  auto job = make_job(&o);
  EXPECT_TRUE(job->check_continue().ok());
  job->cancel(absl::CancelledError("first"));
  job->cancel(absl::DeadlineExceededError("second"));  // the first reason wins
  EXPECT_TRUE(absl::IsCancelled(job->check_continue()));
  EXPECT_EQ(job->check_continue().message(), "first");

  auto expired = make_job(&o, Clock::now() - std::chrono::milliseconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(expired->check_continue()));
}

TEST(Job, NoProgressAfterFinish) {
  int events = 0;
  JobSpec spec;
  auto job =
      std::make_shared<Job>(spec, Clock::now(), Clock::time_point::max(),
                            testing::callback_events([&events](const ProgressEvent&) { ++events; },
                                                     [](const absl::Status&, JobResult&&) {}));
  job->report_progress({});  // queued: not running yet
  ASSERT_TRUE(job->start_running());
  job->report_progress({});
  job->finish(absl::OkStatus());
  job->report_progress({});
  EXPECT_EQ(events, 1);
}

TEST(Job, FinishListenerRunsAfterTheOutcome) {
  std::vector<std::string> order;
  JobSpec spec;
  auto job = std::make_shared<Job>(
      spec, Clock::now(), Clock::time_point::max(),
      testing::callback_events(
          nullptr, [&order](const absl::Status&, JobResult&&) { order.push_back("done"); }));
  job->set_on_finished([&order] { order.push_back("finished"); });
  job->finish(absl::CancelledError("x"));
  job->finish(absl::CancelledError("y"));
  EXPECT_EQ(order, (std::vector<std::string>{"done", "finished"}));
}

TEST(JobEvents, OnlyWhatTheFrontEndWantsThenDoneLast) {
  int wakes = 0;
  auto events = std::make_shared<JobEvents>(JobEvents::Wants{}, [&wakes] { ++wakes; });
  auto job = std::make_shared<Job>(JobSpec{}, Clock::now(), Clock::time_point::max(), events);
  ASSERT_TRUE(job->start_running());
  job->report_progress({});  // a unary call wants no progress
  EncodedImage image{{1, 2, 3}, ImageFormat::kPng, 1, 1, 9};
  job->report_image(image, 0);  // nor images one by one: the result keeps the bytes
  EXPECT_EQ(image.bytes.size(), 3u);
  EXPECT_EQ(wakes, 0);
  job->finish(absl::CancelledError("gone"));
  events->push(JobEvent{});  // nothing follows done
  EXPECT_EQ(wakes, 1);
  std::optional<JobEvent> done = events->next();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->kind, JobEvent::Kind::kDone);
  EXPECT_TRUE(absl::IsCancelled(done->status));
  EXPECT_FALSE(events->next().has_value());
  EXPECT_TRUE(events->done());
}

TEST(JobEvents, StreamedImagesMoveTheirBytesIntoTheirEvent) {
  auto events =
      std::make_shared<JobEvents>(JobEvents::Wants{.progress = true, .images = true}, nullptr);
  auto job = std::make_shared<Job>(JobSpec{}, Clock::now(), Clock::time_point::max(), events);
  ASSERT_TRUE(job->start_running());
  ProgressEvent step;
  step.step_index = 2;
  job->report_progress(step);
  EncodedImage image{{1, 2, 3}, ImageFormat::kJpeg, 4, 5, 9};
  job->report_image(image, 1);
  EXPECT_TRUE(image.bytes.empty());  // the result describes it; the event carries it
  EXPECT_EQ(image.width, 4);
  std::optional<JobEvent> progress = events->next(), encoded = events->next();
  ASSERT_TRUE(progress && encoded);
  EXPECT_EQ(progress->kind, JobEvent::Kind::kProgress);
  EXPECT_EQ(progress->progress.step_index, 2);
  EXPECT_EQ(encoded->kind, JobEvent::Kind::kImage);
  EXPECT_EQ(encoded->image.bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(encoded->image_index, 1);
  EXPECT_EQ(encoded->image.format, ImageFormat::kJpeg);
  EXPECT_EQ(encoded->image.seed, 9u);
}

}  // namespace
}  // namespace flux2::server
