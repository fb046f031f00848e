// Notices the engine stuck in one stage of a request (a denoising step, the text encoder, the VAE
// decode) far past the time it should take: a hung kernel, a wedged driver. Tested by
// tests/server/fault_test.cc (alone and through the Server).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "server/serving/job.h"

namespace flux2::server {

// When a stage counts as stalled: after max(min_seconds, step_multiple x its expected time).
struct StallPolicy {
  double min_seconds = 60.0;    // --stall-timeout-min-s
  double step_multiple = 20.0;  // --stall-step-multiple
  double limit(double expected_seconds) const;
};

// What on_stall is told.
struct Stall {
  std::string request_id;
  double limit_seconds = 0.0;  // the stage ran longer than this
};

// A thread that watches the stage boundaries the engine worker reports. on_stall runs once per
// stalled stage, on_recovered when that stage ends after all; both on the watchdog's thread, in
// that order.
class StallWatchdog {
 public:
  StallWatchdog(StallPolicy policy, std::function<void(const Stall&)> on_stall,
                std::function<void()> on_recovered);
  ~StallWatchdog();  // stops the thread

  // A new stage of `request_id` begins now; it should take about `expected_seconds` (0: not
  // known, the policy's minimum applies).
  void stage_started(const std::string& request_id, double expected_seconds);
  // No request runs (between requests, or the worker stopped).
  void idle();

 private:
  void run();

  const StallPolicy policy_;
  const std::function<void(const Stall&)> on_stall_;
  const std::function<void()> on_recovered_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool busy_ = false;           // a stage is running
  uint64_t stage_ = 0;          // counts stage_started / idle calls
  Clock::time_point deadline_;  // the running stage is stalled after this
  double limit_seconds_ = 0.0;  // deadline_ - the stage's start
  std::string request_id_;
  std::thread thread_;
};

}  // namespace flux2::server
