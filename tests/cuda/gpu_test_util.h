// Helpers for the GPU tests: skip with a message where no GPU exists, a shared CUDA backend, and
// random bf16 matrices / byte comparison through the backend.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/cuda/cuda_backend.h"

namespace flux2::testing {

// tests/data: $FLUX2_TEST_DATA when set (the GPU machine runs a copy of the tree elsewhere), else
// the path compiled in.
std::string test_data_dir();

// A fast path's counters now (zeros when it has not run yet), and one fallback reason's count.
FastPathCounters fast_path_counters(const std::string& path);
int64_t fast_path_fallbacks(const std::string& path, const std::string& reason);

// Sets a backend's request quality for a scope, back to lossless at its end (the backend is
// shared by the tests of a process, so a failed assertion must not leave it at high).
class QualityScope {
 public:
  QualityScope(Backend& be, Quality quality) : be_(be) { be_.set_quality(quality); }
  ~QualityScope() { be_.set_quality(Quality::kLossless); }
  QualityScope(const QualityScope&) = delete;
  QualityScope& operator=(const QualityScope&) = delete;

 private:
  Backend& be_;
};

// The process-wide CUDA backend, or null (with the reason) when there is no usable GPU.
Backend* gpu_backend(std::string* why);

#define FLUX2_REQUIRE_GPU(backend)                                         \
  std::string flux2_no_gpu_reason_;                                        \
  Backend* backend = ::flux2::testing::gpu_backend(&flux2_no_gpu_reason_); \
  if (backend == nullptr) GTEST_SKIP() << "no usable CUDA GPU: " << flux2_no_gpu_reason_

// A bf16 [rows, cols] tensor of uniform values in [-scale, scale] (seeded).
Tensor random_bf16(Backend& be, int64_t rows, int64_t cols, uint64_t seed, float scale = 1.0f);
// The raw bf16 bits of a (possibly strided) tensor, row by row.
std::vector<uint16_t> bits(Backend& be, const Tensor& t);
// Values of a tensor as floats.
std::vector<float> values(Backend& be, const Tensor& t);
// A device copy of `t` (contiguous, same dtype).
Tensor clone(Backend& be, const Tensor& t);
// A random weight [n, k] registered for quality=high's FP8 GEMMs.
Tensor fp8_weight(Backend& be, int64_t n, int64_t k, uint64_t seed);
// A small op on unrelated tensors: ends any producer hand-off between two ops.
void unrelated_op(Backend& be);

}  // namespace flux2::testing
