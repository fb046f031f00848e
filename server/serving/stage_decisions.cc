// Rank 0's stage-boundary answers for the other ranks; see stage_decisions.h.
// Tested by tests/server/parallel_engine_test.cc.
#include "server/serving/stage_decisions.h"

#include "absl/strings/str_cat.h"

namespace flux2::server {

absl::Status StageDecisions::decide(const std::function<absl::Status()>& check) {
  absl::Status answer = check ? check() : absl::OkStatus();
  {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back(answer);
    ++next_[0];
  }
  cv_.notify_all();
  return answer;
}

absl::Status StageDecisions::await(int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t boundary = next_.at(static_cast<size_t>(rank))++;
  cv_.wait(lock, [&] { return static_cast<int64_t>(answers_.size()) > boundary || ended_; });
  if (static_cast<int64_t>(answers_.size()) > boundary) return answers_[boundary];
  return absl::AbortedError(absl::StrCat("rank ", rank, " stopped at stage boundary ", boundary,
                                         ", which rank 0 never reached: ", ended_->ToString()));
}

void StageDecisions::end(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = why;
  }
  cv_.notify_all();
}

std::optional<absl::Status> StageDecisions::stop() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (answers_.empty() || answers_.back().ok()) return std::nullopt;
  return answers_.back();
}

}  // namespace flux2::server
