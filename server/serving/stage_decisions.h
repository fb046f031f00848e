// StageDecisions: rank 0's hooks.check_continue answers for one request over several ranks, one
// per stage boundary, handed to the other ranks so that every rank stops at the same boundary (or
// none does). Tested by tests/server/parallel_engine_test.cc.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace flux2::server {

// Why a host-side hand-over and not a collective: the ranks are threads of one process, so a
// mutex and a condition variable cost microseconds and need no device memory, no stream and no
// device-to-host wait (a NCCL broadcast of the answer would need all three on every rank at every
// boundary), they work alike over the CPU and the NCCL communicators, and unlike a collective
// they can be ended from the host when rank 0 fails (end()), where NCCL peers would wait forever.
// Rank 0 never waits here: the others wait for its answer, as they would at the step's first
// collective anyway.
class StageDecisions {
 public:
  explicit StageDecisions(int ranks) : next_(static_cast<size_t>(ranks), 0) {}

  // Rank 0 at its next boundary: asks `check` (null: continue), records the answer for the other
  // ranks' same boundary, and returns it.
  absl::Status decide(const std::function<absl::Status()>& check);
  // Rank `rank` > 0 at its next boundary: waits for rank 0's answer at that boundary and returns
  // it; once end() was called without an answer for it, Aborted naming end's reason.
  absl::Status await(int rank);
  // Rank 0's generation is over (`why`: its status): ranks still waiting, or arriving later at a
  // boundary rank 0 never answered, get Aborted instead of waiting.
  void end(const absl::Status& why);
  // The non-OK answer rank 0 stopped with (Cancelled, DeadlineExceeded, ...), if it did.
  std::optional<absl::Status> stop() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<absl::Status> answers_;  // rank 0's, boundary by boundary
  std::vector<int64_t> next_;          // each rank's next boundary
  std::optional<absl::Status> ended_;  // end()'s reason
};

}  // namespace flux2::server
