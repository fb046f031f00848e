// One persistent thread per rank; see rank_threads.h.
// Tested by tests/server/parallel_engine_test.cc.
#include "server/serving/rank_threads.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <latch>
#include <mutex>
#include <thread>
#include <utility>

namespace flux2::server {

// One rank's thread and its queue; shared with the thread, so a detached thread keeps it alive.
struct RankThreads::Rank {
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool running = false;  // the thread runs a piece of work now
  bool stop = false;
  std::thread thread;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [this] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, with nothing left to run
      std::function<void()> work = std::move(queue.front());
      queue.pop_front();
      running = true;
      lock.unlock();
      work();
      lock.lock();
      running = false;
      cv.notify_all();  // wait_idle
    }
  }
};

RankThreads::RankThreads(int ranks) {
  for (int r = 0; r < ranks; ++r) {
    auto rank = std::make_shared<Rank>();
    rank->thread = std::thread([rank] { rank->loop(); });
    ranks_.push_back(std::move(rank));
  }
}

RankThreads::~RankThreads() {
  for (const std::shared_ptr<Rank>& rank : ranks_) {
    bool idle;
    {
      std::lock_guard<std::mutex> lock(rank->mu);
      idle = !rank->running && rank->queue.empty();
      rank->stop = true;
    }
    rank->cv.notify_all();
    if (idle) {
      rank->thread.join();
    } else {
      rank->thread.detach();
    }
  }
}

void RankThreads::post(int rank, std::function<void()> work) {
  Rank& r = *ranks_.at(static_cast<size_t>(rank));
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.queue.push_back(std::move(work));
  }
  r.cv.notify_all();
}

void RankThreads::run_all(const std::function<void(int rank)>& work) {
  std::latch done(size());
  for (int r = 0; r < size(); ++r) {
    post(r, [&work, &done, r] {
      work(r);
      done.count_down();
    });
  }
  done.wait();
}

bool RankThreads::wait_idle(int rank, double seconds) const {
  Rank& r = *ranks_.at(static_cast<size_t>(rank));
  std::unique_lock<std::mutex> lock(r.mu);
  return r.cv.wait_for(lock, std::chrono::duration<double>(seconds),
                       [&] { return !r.running && r.queue.empty(); });
}

}  // namespace flux2::server
