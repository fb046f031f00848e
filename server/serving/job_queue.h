// The bounded admission queue in front of the worker: push() admits a
// job or fails at once (ResourceExhausted when full, Unavailable once closed for draining); the
// worker pops jobs in arrival order; a job cancelled while waiting is removed at once so it frees
// its slot. Tested by tests/server/job_queue_test.cc.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "server/serving/job.h"

namespace flux2::server {

class JobQueue {
 public:
  // `capacity`: jobs that may wait (the running one is not counted). `on_depth` (optional) is
  // called with the new depth after every change, under the queue's lock (keep it cheap).
  explicit JobQueue(int capacity, std::function<void(int)> on_depth = nullptr);

  // Admits `job`: ResourceExhausted when `capacity` jobs already wait, Unavailable after close().
  absl::Status push(std::shared_ptr<Job> job);
  // Blocks until a job waits (returns it, oldest first) or the queue is closed and empty
  // (returns nullptr).
  std::shared_ptr<Job> pop();
  // Removes `job` if it still waits; false when the worker already took it (or it never came).
  bool remove(const Job* job);
  // Refuses new jobs from now on; pop() still returns the ones waiting, then nullptr.
  void close();
  // Removes and returns every waiting job (the drain deadline passed).
  std::vector<std::shared_ptr<Job>> take_all();

  int size() const;
  int capacity() const { return capacity_; }
  bool closed() const;

 private:
  void notify_depth_locked() const;

  const int capacity_;
  std::function<void(int)> on_depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;  // guarded by mu_
  bool closed_ = false;                    // guarded by mu_
};

}  // namespace flux2::server
