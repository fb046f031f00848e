// Helpers for the GPU tests: skip with a message where no CUDA device exists (and fail where one
// exists but the backend does not start), a shared CUDA backend, and random bf16 matrices / byte
// comparison through the backend. Used by every test in tests/cuda.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/host/test_util.h"

namespace flux2::testing {

// A fast path's counters now (zeros when it has not run yet), and one fallback reason's count.
FastPathCounters fast_path_counters(const std::string& path);
int64_t fast_path_fallbacks(const std::string& path, const std::string& reason);

// The process-wide CUDA backend, or null with the reason; `*no_device` tells whether that is
// because no CUDA device exists here (the one case a GPU test skips).
Backend* gpu_backend(std::string* why, bool* no_device = nullptr);

// Skips the test where no CUDA device exists (CI); on a machine with one, a backend that fails to
// start (cuBLASLt or cuDNN not loading, ...) fails the test.
#define FLUX2_REQUIRE_GPU(backend)                                                            \
  std::string flux2_no_gpu_reason_;                                                           \
  bool flux2_no_device_ = false;                                                              \
  Backend* backend = ::flux2::testing::gpu_backend(&flux2_no_gpu_reason_, &flux2_no_device_); \
  if (backend == nullptr && flux2_no_device_)                                                 \
    GTEST_SKIP() << "no CUDA device: " << flux2_no_gpu_reason_;                               \
  if (backend == nullptr) FAIL() << "the CUDA backend did not start: " << flux2_no_gpu_reason_

// A bf16 [rows, cols] tensor of uniform values in [-scale, scale] (seeded).
Tensor random_bf16(Backend& be, int64_t rows, int64_t cols, uint64_t seed, float scale = 1.0f);
// The raw bf16 bits of a (possibly strided) tensor, row by row.
std::vector<uint16_t> bits(Backend& be, const Tensor& t);
// Values of a tensor as floats.
std::vector<float> values(Backend& be, const Tensor& t);
// A device copy of `t` (contiguous, same dtype).
Tensor clone(Backend& be, const Tensor& t);
// A random weight [n, k] registered for quality=high's FP8 GEMMs.
Weight fp8_weight(Backend& be, int64_t n, int64_t k, uint64_t seed);

}  // namespace flux2::testing
