// RankThreads: one persistent thread per rank of a multi-rank engine (parallel_engine.h). A rank's
// backend is driven by its own thread only (a CUDA device is current per thread), for its whole
// life: creation, every request, its end. Tested by tests/server/parallel_engine_test.cc.
#pragma once

#include <functional>
#include <memory>
#include <vector>

namespace flux2::server {

class RankThreads {
 public:
  // Starts `ranks` threads, idle until work is posted.
  explicit RankThreads(int ranks);
  // Ends and joins every idle thread. A thread still running its work (a rank blocked for good in
  // a collective on its device after a peer failed) is detached instead, with its queue: whatever
  // that work references must then be leaked by the owner (wait_idle says which).
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }

  // Queues `work` on rank `rank`'s thread and returns at once; each thread runs its work in
  // order.
  void post(int rank, std::function<void()> work);
  // Runs work(r) on every rank's thread at once and returns when all have run.
  void run_all(const std::function<void(int rank)>& work);
  // Waits up to `seconds` for rank `rank`'s thread to have no work queued or running; returns
  // whether it is idle. (A rank's work may signal its caller just before its thread is idle.)
  bool wait_idle(int rank, double seconds) const;

 private:
  struct Rank;
  std::vector<std::shared_ptr<Rank>> ranks_;
};

}  // namespace flux2::server
