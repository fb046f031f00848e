// Host-compilable entry point of the CUDA backend (style.md P2: no CUDA types beyond cudaStream_t).
// Tested by tests/cuda/ on a GPU machine; skipped where no GPU exists.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace flux2 {

// The CUDA backend on the current device; Unavailable when no usable GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> create_cuda_backend();

struct CudaDeviceInfo {
  std::string name;            // "NVIDIA H200"
  int major = 0, minor = 0;    // compute capability
  int64_t total_bytes = 0;     // device memory
  int multiprocessors = 0;
};

// The current device, or Unavailable (with the CUDA error) when there is none.
absl::StatusOr<CudaDeviceInfo> cuda_device_info();

}  // namespace flux2
