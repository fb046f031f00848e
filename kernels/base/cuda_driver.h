// What cudaErrorInsufficientDriver means to the person starting the server: no NVIDIA driver at
// all (no GPU here: NotFound, the CPU fallback applies) or a driver older than the CUDA runtime
// this build links (a GPU that cannot be used: FailedPrecondition saying which versions). Kept out
// of the CUDA sources so the CPU tests check it (tests/host/small_units_test.cc).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flux2 {

// "13.0" for CUDA's version integer 13000 (1000 * major + 10 * minor).
inline std::string cuda_version_text(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

// driver_version: cudaDriverGetVersion's (0 when no driver is installed); runtime_version:
// cudaRuntimeGetVersion's.
inline absl::Status insufficient_driver_status(int driver_version, int runtime_version) {
  if (driver_version <= 0) {
    return absl::NotFoundError("no CUDA device: no NVIDIA driver is installed (libcuda.so.1)");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the NVIDIA driver is too old: it supports CUDA ",
                   cuda_version_text(driver_version), " but this build needs CUDA ",
                   cuda_version_text(runtime_version), "; install a driver for CUDA ",
                   cuda_version_text(runtime_version), " or newer (or run with --backend cpu)"));
}

}  // namespace flux2
