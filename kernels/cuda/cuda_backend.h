// The CUDA backend (design.md): bf16 activations and weights, fp32 accumulation, cuBLASLt GEMMs,
// cuDNN attention and convolutions, custom kernels with eager reference chains and fused fast
// paths (fallbacks counted in the fast-path registry). Host-compilable: only cudaStream_t leaks.
// Tested by tests/cuda/ on a GPU machine; those tests skip with a message where no GPU exists.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace flux2 {

// The CUDA backend on the current device; Unavailable when no usable GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> create_cuda_backend();

struct CudaDeviceInfo {
  std::string name;          // "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
  int64_t total_bytes = 0;   // device memory
  int multiprocessors = 0;
};

// The current device, or Unavailable (with the CUDA error) when there is none.
absl::StatusOr<CudaDeviceInfo> cuda_device_info();

// Test hook: makes the next fused launch of fast path `path` fail as a kernel error would, to
// exercise the disable-and-fall-back rule (tests/cuda/fast_path_fallback_test.cc).
void inject_fast_path_failure(absl::string_view path);

// The backend's stream (for tests and benchmarks that time with CUDA events); null for others.
cudaStream_t cuda_stream_of(Backend& backend);

}  // namespace flux2
