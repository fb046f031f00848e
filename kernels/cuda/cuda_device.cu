// CUDA device discovery and the backend factory entry; see cuda_backend.h.
// Exercised by every test in tests/cuda (they skip without a GPU).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_driver.h"
#include "kernels/cuda/cuda_backend.h"

namespace flux2 {

absl::StatusOr<CudaDeviceInfo> cuda_device_info() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    return insufficient_driver_status(driver, runtime);
  }
  if (error == cudaErrorNoDevice || (error == cudaSuccess && count == 0)) {
    cudaGetLastError();
    return absl::NotFoundError(absl::StrCat(
        "no CUDA device: ", error != cudaSuccess ? cudaGetErrorString(error) : "none found"));
  }
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorString(error)));
  }
  int device = 0;
  cudaDeviceProp prop;
  const cudaError_t props = cudaGetDevice(&device) == cudaSuccess
                                ? cudaGetDeviceProperties(&prop, device)
                                : cudaErrorInvalidDevice;
  if (props != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaGetDeviceProperties failed: ", cudaGetErrorString(props)));
  }
  CudaDeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error of later calls
    return 0;
  }
  return count;
}

absl::Status cuda_set_device(int device) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (this process sees ", count, ")"));
  }
  const cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaSetDevice(", device, ") failed: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace flux2
