// The handler threads; see worker_pool.h.
// Tested through tests/server/http_transport_test.cc.
#include "server/http/transport/worker_pool.h"

#include <utility>

namespace flux2::server::http {

void WorkerPool::start(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

void WorkerPool::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ || !threads_.empty()) {
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  task();
}

void WorkerPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  std::deque<std::function<void()>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.clear();
    left.swap(tasks_);
  }
  for (std::function<void()>& task : left) task();
}

void WorkerPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace flux2::server::http
