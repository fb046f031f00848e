// The PNG/JPEG encoder thread: takes generated images off the worker's critical path (the worker
// starts the next request while the previous one's images are encoded) and completes jobs in the
// order the worker handed them over. Tested by tests/server/engine_worker_test.cc.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "server/ops/metrics.h"
#include "server/serving/job.h"

namespace flux2::server {

class EncodeStage {
 public:
  explicit EncodeStage(Metrics& metrics);
  ~EncodeStage();  // stop()s

  void start();
  // Queues image `index` of `job` for encoding (in the job's ImageFormat).
  void encode(std::shared_ptr<Job> job, GeneratedImage image);
  // Queues the job's completion: after its images are encoded, finishes it with `status` (OK: the
  // encoded images plus `report`; an encoding error turns OK into that error).
  void finish(std::shared_ptr<Job> job, absl::Status status, WorkerReport report);
  // Completes every queued task, then joins the thread. Idempotent.
  void stop();

 private:
  struct Task {
    std::shared_ptr<Job> job;
    bool is_finish = false;
    GeneratedImage image;  // encode tasks
    absl::Status status;   // finish tasks
    WorkerReport report;   // finish tasks
  };
  void run();
  void run_encode(Task& task);
  void run_finish(Task& task);

  Metrics& metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::thread thread_;
};

}  // namespace flux2::server
