// The bounded admission queue; see job_queue.h. Tested by tests/server/job_queue_test.cc.
#include "server/serving/job_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flux2::server {

JobQueue::JobQueue(int capacity, std::function<void(int)> on_depth)
    : capacity_(capacity), on_depth_(std::move(on_depth)) {}

void JobQueue::notify_depth_locked() const {
  if (on_depth_) on_depth_(static_cast<int>(jobs_.size()));
}

absl::Status JobQueue::push(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_)
      return absl::UnavailableError("the server is shutting down; retry on another replica");
    if (static_cast<int>(jobs_.size()) >= capacity_) {
      return absl::ResourceExhaustedError(absl::StrCat("the admission queue is full (", capacity_,
                                                       " requests waiting); retry later"));
    }
    jobs_.push_back(std::move(job));
    notify_depth_locked();
  }
  cv_.notify_one();
  return absl::OkStatus();
}

std::shared_ptr<Job> JobQueue::pop() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !jobs_.empty() || closed_; });
  if (jobs_.empty()) return nullptr;
  std::shared_ptr<Job> job = std::move(jobs_.front());
  jobs_.pop_front();
  notify_depth_locked();
  return job;
}

bool JobQueue::remove(const Job* job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(jobs_.begin(), jobs_.end(),
                         [job](const std::shared_ptr<Job>& queued) { return queued.get() == job; });
  if (it == jobs_.end()) return false;
  jobs_.erase(it);
  notify_depth_locked();
  return true;
}

void JobQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

std::vector<std::shared_ptr<Job>> JobQueue::take_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Job>> taken(std::make_move_iterator(jobs_.begin()),
                                          std::make_move_iterator(jobs_.end()));
  jobs_.clear();
  notify_depth_locked();
  return taken;
}

int JobQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(jobs_.size());
}

bool JobQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace flux2::server
