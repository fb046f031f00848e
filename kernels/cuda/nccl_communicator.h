// The NCCL Communicator: one rank per GPU of this host, all driven by one process (one thread per
// GPU; ncclCommInitAll), for sequence and CFG parallelism (model/sequence_parallel.h). libnccl is
// loaded with dlopen on first use, as cuBLASLt is (cublaslt_api.h), so a binary without it runs
// until a multi-GPU engine is asked for. Host-compilable (only cudaStream_t leaks). Tested by
// tests/cuda/nccl_communicator_test.cc (P = 1 on one GPU; skips without one).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/base/communicator.h"

namespace flux2 {

// The loaded libnccl's version (NCCL_VERSION_CODE form, 22800 for 2.28.0), or FailedPrecondition
// naming what did not load.
absl::StatusOr<int> nccl_version();

// One communicator per device of `devices` (distinct CUDA ordinals): rank i on devices[i],
// enqueuing its collectives on streams[i] (that rank's backend stream: cuda_stream_of). Each is
// then used by one thread with devices[i] current. Transfers are bytes (any dtype); the ranks'
// shapes must agree as Communicator says (the in-process group checks that; here a mismatch is
// not detected). abort() aborts this rank's NCCL communicator only: peers blocked in a collective
// on the device do not notice, so a failing rank must end the whole engine (the server exits, as
// on a sticky CUDA error). Each collective is timed by two CUDA events on streams[i] (made on
// first use, on the rank's thread), read by take_collective_seconds after the caller synchronized:
// no host wait is added to a collective.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> create_nccl_group(
    const std::vector<int>& devices, const std::vector<cudaStream_t>& streams);

}  // namespace flux2
