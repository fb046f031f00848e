// Communicator: the collectives P ranks of one host use to split one request between them
// (Ulysses sequence parallelism and CFG parallelism, model/sequence_parallel.h), and the time they
// take (the all-to-all time per step of flux2_denoise_step_collective_seconds). Implemented by
// kernels/cpu/in_process_communicator.h (ranks as threads, host tensors) and
// kernels/cuda/nccl_communicator.h (one GPU per rank). Tested by
// tests/host/sequence_parallel_test.cc and tests/cuda/nccl_communicator_test.cc.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/tensor.h"

namespace flux2 {

// The time one rank's collectives took, by kind, in seconds
// (Communicator::take_collective_seconds).
struct CollectiveSeconds {
  double all_to_all = 0.0;  // Ulysses' exchanges around attention
  double all_gather = 0.0;  // the velocity's gather at the end of a forward, the CFG exchange

  double total() const { return all_to_all + all_gather; }
  CollectiveSeconds& operator+=(const CollectiveSeconds& other) {
    all_to_all += other.all_to_all;
    all_gather += other.all_gather;
    return *this;
  }
};

// One rank's handle on a group of `size()` ranks. Every rank of the group makes the same calls in
// the same order (a collective returns on one rank only once every rank has entered it, or once
// the group was aborted). Tensors live where the rank's backend computes (host memory for the
// in-process group, the rank's GPU for NCCL), are contiguous and of one dtype across the call. On
// an asynchronous backend a collective is enqueued on the backend's stream: ops issued after it
// see its results, and its inputs must not change before the ops issued before it have run. The
// bytes move unchanged (no reduction), so a collective is deterministic and exact.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // 0 .. size() - 1
  virtual int size() const = 0;

  // Personalized exchange: send[i] goes to rank i, which receives it in its recv[rank()]. Both
  // vectors hold size() tensors; send[i] here and recv[rank()] on rank i have the same shape
  // (which may differ from rank to rank: uneven shards; 0 rows allowed). send[rank()] is copied
  // into recv[rank()] locally.
  virtual absl::Status all_to_all(const std::vector<Tensor>& send,
                                  const std::vector<Tensor>& recv) = 0;

  // recv[j] = rank j's `send` for every j (recv holds size() tensors; shapes may differ by
  // rank). recv[rank()] may be `send` itself (in place: nothing to copy).
  virtual absl::Status all_gather(const Tensor& send, const std::vector<Tensor>& recv) = 0;

  // Ends the group after a failure on this rank (a cancelled request, an op error): the other
  // ranks' pending and later collectives return an error naming `why` instead of waiting for this
  // rank forever. Later calls on this rank fail too.
  virtual void abort(const absl::Status& why) = 0;

  // The time this rank's collectives that returned OK took since the last call (or since the
  // group was made), by kind; the count starts anew at every call, whatever it returns. Each
  // collective counts from its start on this rank to its end, the wait for slower peers included
  // (so a rank whose peers compute longer shows it here). In-process: host wall time. NCCL:
  // device time between CUDA events recorded on the stream around the collective's copy and NCCL
  // calls, read here without waiting: call it once the backend synchronized after the
  // collectives (a denoising step's end, which synchronizes anyway); FailedPrecondition when one
  // has not run on the device yet. A collective of a group of 1 is timed too (its local copy).
  virtual absl::StatusOr<CollectiveSeconds> take_collective_seconds() = 0;
};

// Checks a collective's arguments on one rank: `count` tensors per vector (the group size),
// each contiguous, of `dtype` and on `device`. InvalidArgument naming the collective and the
// offending tensor otherwise.
absl::Status check_collective_tensors(const char* collective, const char* name,
                                      const std::vector<Tensor>& tensors, int count, DType dtype,
                                      Device device);

}  // namespace flux2
