// The CUDA backend: bf16 activations and weights, fp32 accumulation, cuBLASLt GEMMs,
// cuDNN attention and convolutions, custom kernels with eager reference chains and fused fast
// paths (fallbacks counted in the fast-path registry). Host-compilable: only cudaStream_t leaks.
// Tested by tests/cuda/ on a GPU machine; those tests skip with a message where no GPU exists.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/backend_options.h"

namespace flux2 {

// The CUDA backend on the current device; NotFound when there is no CUDA device, any other error
// when one exists but the backend cannot start on it (a library that does not load, ...).
absl::StatusOr<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& options = {});

struct CudaDeviceInfo {
  std::string name;          // "NVIDIA H200"
  int major = 0, minor = 0;  // compute capability
  int64_t total_bytes = 0;   // device memory
  int multiprocessors = 0;
};

// The current device; NotFound when there is none (no device, or no driver to reach one),
// Internal when the runtime fails otherwise.
absl::StatusOr<CudaDeviceInfo> cuda_device_info();

// The backend's stream (for tests and benchmarks that time with CUDA events); null for others.
cudaStream_t cuda_stream_of(Backend& backend);

// The CUDA devices this process sees (cudaGetDeviceCount); 0 without a device or a driver.
int cuda_device_count();

// Makes device ordinal `device` current on the calling thread (cudaSetDevice): the CUDA calls the
// thread makes afterwards, a backend's creation included, go to it. InvalidArgument naming the
// ordinal and the device count when it does not exist.
absl::Status cuda_set_device(int device);

}  // namespace flux2
