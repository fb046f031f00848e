// A small fork-join thread pool behind parallel_for; see parallel.h.
#include "kernels/base/parallel.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace flux2 {
namespace {

thread_local bool in_parallel_region = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(i) for i in [0, count) across the pool and the calling thread.
  void run(int count, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> run_lock(run_mutex_);  // one fork-join at a time
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      next_ = 0;
      count_ = count;
      pending_ = count;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void drain() {
    for (;;) {
      int index;
      const std::function<void(int)>* task;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (task_ == nullptr || next_ >= count_) return;
        index = next_++;
        task = task_;
      }
      in_parallel_region = true;
      (*task)(index);
      in_parallel_region = false;
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      drain();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* task_ = nullptr;
  int next_ = 0;
  int count_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

std::mutex configure_mutex;
int requested_threads = 0;  // set_parallel_thread_count's value; 0: the hardware's
bool pool_started = false;  // the pool exists and its size is fixed

ThreadPool& pool() {
  static ThreadPool instance([] {
    std::lock_guard<std::mutex> lock(configure_mutex);
    pool_started = true;
    return requested_threads > 0
               ? requested_threads
               : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return instance;
}

}  // namespace

absl::Status set_parallel_thread_count(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cpu-threads: ", threads, " is negative"));
  }
  {
    std::lock_guard<std::mutex> lock(configure_mutex);
    if (!pool_started) {
      requested_threads = threads;
      return absl::OkStatus();
    }
  }
  if (threads == 0 || threads == parallel_thread_count()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("cpu-threads: the worker pool already runs ", parallel_thread_count(),
                   " threads; it is sized once, before the first parallel_for"));
}

int parallel_thread_count() {
  return pool().size();
}

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int chunks = static_cast<int>(std::min<int64_t>(parallel_thread_count(), max_chunks));
  if (chunks <= 1 || in_parallel_region) {
    fn(0, n);
    return;
  }
  pool().run(chunks, [&](int i) {
    const int64_t begin = n * i / chunks;
    const int64_t end = n * (i + 1) / chunks;
    fn(begin, end);
  });
}

}  // namespace flux2
