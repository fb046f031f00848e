// CUDA error handling for host code in kernels/cuda, in the tiers of kernels/base/status.h:
// cuda_status() turns a cudaError_t into an absl::Status; FLUX_CUDA_CHECK aborts on errors that
// leave the device in an unknown state. Tested through every CUDA test.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace flux2 {

// OK for cudaSuccess; out-of-memory is ResourceExhausted (fails only the request), anything else
// Internal. `what` names the call site.
inline absl::Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace flux2

#define FLUX_CUDA_CHECK(call)                                                  \
  do {                                                                         \
    const cudaError_t flux_cuda_error_ = (call);                               \
    if (flux_cuda_error_ != cudaSuccess) {                                     \
      std::fprintf(stderr, "FLUX_CUDA_CHECK failed: %s: %s at %s:%d\n", #call, \
                   cudaGetErrorString(flux_cuda_error_), __FILE__, __LINE__);  \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

// Returns the status of the last kernel launch from the enclosing function.
#define FLUX_RETURN_IF_LAUNCH_FAILED(what)                                                   \
  do {                                                                                       \
    const absl::Status flux_launch_status_ = ::flux2::cuda_status(cudaGetLastError(), what); \
    if (!flux_launch_status_.ok()) return flux_launch_status_;                               \
  } while (0)
