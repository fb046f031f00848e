// The stall watchdog; see stall_watchdog.h. Tested by tests/server/fault_test.cc.
#include "server/serving/stall_watchdog.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace flux2::server {

double StallPolicy::limit(double expected_seconds) const {
  return std::max(min_seconds, step_multiple * expected_seconds);
}

StallWatchdog::StallWatchdog(StallPolicy policy, std::function<void(const Stall&)> on_stall,
                             std::function<void()> on_recovered)
    : policy_(policy), on_stall_(std::move(on_stall)), on_recovered_(std::move(on_recovered)) {
  thread_ = std::thread([this] { run(); });
}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallWatchdog::stage_started(const std::string& request_id, double expected_seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = true;
    ++stage_;
    limit_seconds_ = policy_.limit(expected_seconds);
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(limit_seconds_));
    request_id_ = request_id;
  }
  cv_.notify_all();
}

void StallWatchdog::idle() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    ++stage_;
  }
  cv_.notify_all();
}

void StallWatchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!busy_) {
      cv_.wait(lock);
      continue;
    }
    const uint64_t stage = stage_;
    if (cv_.wait_until(lock, deadline_, [&] { return stop_ || stage_ != stage; })) continue;
    // The same stage is still running past its limit.
    const Stall stall{request_id_, limit_seconds_};
    lock.unlock();
    if (on_stall_) on_stall_(stall);
    lock.lock();
    cv_.wait(lock, [&] { return stop_ || stage_ != stage; });
    if (stop_) break;
    lock.unlock();
    if (on_recovered_) on_recovered_();
    lock.lock();
  }
}

}  // namespace flux2::server
