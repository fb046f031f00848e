// Ranks as threads: a generation-counting barrier and memcpy between the ranks' host tensors, each
// collective timed on the steady clock; see in_process_communicator.h. Tested by
// tests/host/sequence_parallel_test.cc.
#include "kernels/cpu/in_process_communicator.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/elapsed.h"
#include "kernels/base/status.h"

namespace flux2 {
namespace {

// What the ranks of a group share: the barrier, each rank's posted tensors and the first abort.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size) : size_(size), send_lists_(size), send_ones_(size) {}
  int size() const { return size_; }

  // Publishes rank `rank`'s tensors of the collective about to run (read by the others after the
  // next barrier, until the one after it).
  void post(int rank, const std::vector<Tensor>* list, const Tensor* one) {
    std::lock_guard<std::mutex> lock(mutex_);
    send_lists_[rank] = list;
    send_ones_[rank] = one;
  }
  const std::vector<Tensor>& list_of(int rank) const { return *send_lists_[rank]; }
  const Tensor& one_of(int rank) const { return *send_ones_[rank]; }

  // The barrier a collective starts with: OK once every rank has arrived, or the group's failure
  // once a rank aborted before they all did (then no rank reads another's tensors).
  absl::Status enter() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!failure_.ok()) return failure_;
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return absl::OkStatus();
    }
    changed_.wait(lock, [&] { return generation_ != generation || !failure_.ok(); });
    return generation_ != generation ? absl::OkStatus() : failure_;
  }

  // The barrier a collective ends with, after enter() let every rank in: it waits for all of them
  // whatever happens (between the two they only copy, so they all come), so no rank's tensors go
  // away while another still reads them. `mine`: how this rank's part went (a failing rank aborts
  // the group first); the others then return the group's failure.
  absl::Status leave(const absl::Status& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    round_failed_ = round_failed_ || !mine.ok();
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      last_round_failed_ = round_failed_;
      round_failed_ = false;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation; });
    }
    if (!mine.ok()) return mine;
    return last_round_failed_ ? failure_ : absl::OkStatus();
  }

  void abort(int rank, const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.ok()) {
      failure_ = absl::AbortedError(
          absl::StrCat("rank ", rank, " of ", size_, " ended the group: ", why.message()));
    }
    changed_.notify_all();
  }

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool round_failed_ = false;       // a rank's part of the collective now ending failed
  bool last_round_failed_ = false;  // the same for the last one that ended
  absl::Status failure_;
  std::vector<const std::vector<Tensor>*> send_lists_;
  std::vector<const Tensor*> send_ones_;
};

// dst = src for two contiguous host tensors of one shape and dtype.
absl::Status copy_exact(const char* collective, int from, const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape() || src.dtype() != dst.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(collective, ": rank ", from, " sends ",
                                                   src.describe(), " where ", dst.describe(),
                                                   " is expected"));
  }
  if (src.numel() > 0 && src.data() != dst.data()) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(src.bytes()));
  }
  return absl::OkStatus();
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  absl::Status all_to_all(const std::vector<Tensor>& send,
                          const std::vector<Tensor>& recv) override {
    constexpr const char* kOp = "all_to_all";
    const DType dtype = send.empty() ? DType::kF32 : send[0].dtype();
    absl::Status status = check_collective_tensors(kOp, "send", send, size(), dtype, Device::kCpu);
    if (status.ok()) {
      status = check_collective_tensors(kOp, "recv", recv, size(), dtype, Device::kCpu);
    }
    return run(status, &send, nullptr, &CollectiveSeconds::all_to_all,
               [&](int j) { return copy_exact(kOp, j, group_->list_of(j)[rank_], recv[j]); });
  }

  absl::Status all_gather(const Tensor& send, const std::vector<Tensor>& recv) override {
    constexpr const char* kOp = "all_gather";
    absl::Status status =
        check_collective_tensors(kOp, "send", {send}, 1, send.dtype(), Device::kCpu);
    if (status.ok()) {
      status = check_collective_tensors(kOp, "recv", recv, size(), send.dtype(), Device::kCpu);
    }
    return run(status, nullptr, &send, &CollectiveSeconds::all_gather,
               [&](int j) { return copy_exact(kOp, j, group_->one_of(j), recv[j]); });
  }

  void abort(const absl::Status& why) override { group_->abort(rank_, why); }

  absl::StatusOr<CollectiveSeconds> take_collective_seconds() override {
    return std::exchange(seconds_, CollectiveSeconds{});
  }

 private:
  // A collective: this rank's checks (`checked`), post, enter, receive from every rank j with
  // receive(j), leave; its wall time, once it returned OK, adds to seconds_.*kind. Any failure
  // here aborts the group, so no rank waits for this one in vain.
  template <typename Receive>
  absl::Status run(absl::Status checked, const std::vector<Tensor>* list, const Tensor* one,
                   double CollectiveSeconds::*kind, const Receive& receive) {
    if (!checked.ok()) {
      group_->abort(rank_, checked);
      return checked;
    }
    const auto start = std::chrono::steady_clock::now();
    group_->post(rank_, list, one);
    FLUX_RETURN_IF_ERROR(group_->enter());
    absl::Status status;
    for (int j = 0; status.ok() && j < size(); ++j) status = receive(j);
    if (!status.ok()) group_->abort(rank_, status);
    FLUX_RETURN_IF_ERROR(group_->leave(status));
    seconds_.*kind += seconds_since(start);
    return absl::OkStatus();
  }

  std::shared_ptr<InProcessGroup> group_;
  const int rank_;
  CollectiveSeconds seconds_;  // since the last take_collective_seconds (this rank's thread only)
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> create_in_process_group(int size) {
  auto group = std::make_shared<InProcessGroup>(size);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.push_back(std::make_unique<InProcessCommunicator>(group, rank));
  }
  return ranks;
}

}  // namespace flux2
