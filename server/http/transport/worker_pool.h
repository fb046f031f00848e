// WorkerPool: the threads Application::handle runs on, off the I/O threads, so a slow handler
// never holds up a socket. A FIFO of tasks; its length is bounded by the transport (one exchange
// in flight per connection). Tested through tests/server/http_transport_test.cc.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flux2::server::http {

class WorkerPool {
 public:
  WorkerPool() = default;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() { stop(); }

  void start(int threads);
  // Queues `task`; after stop() it runs on the caller's thread instead (nothing is dropped).
  void post(std::function<void()> task);
  // Runs what is queued, then joins the threads. Idempotent.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace flux2::server::http
