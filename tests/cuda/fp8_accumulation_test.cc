// The FP8 GEMM's accumulation (cuBLASLt FAST_ACCUM, on by default at quality=high) against the
// error FP8 already accepts: at the FLUX.2 reduction lengths its error stays far below that of the
// E4M3 operands themselves. Float64 references on sampled outputs; skips without a GPU.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/numerics.h"
#include "kernels/cuda/gemm.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

// Fast accumulation may add at most 1/8 of the operand quantization error, i.e. in quadrature
// less than 1% on top of it (sqrt(1 + 1/64) = 1.0078): it must not be what limits quality=high.
constexpr double kAccumulationShareOfQuantization = 1.0 / 8;

struct DeviceBytes {
  explicit DeviceBytes(size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceBytes() { cudaFree(data); }
  void* data = nullptr;
};

// E4M3 codes of `values` under a per-tensor scale (the CPU reference quantizer), and that scale.
std::vector<uint8_t> quantize(const std::vector<float>& values, float* scale) {
  float amax = 0.0f;
  for (float v : values) amax = abs_max(amax, v);
  *scale = fp8_dequant_scale(amax);
  std::vector<uint8_t> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i) codes[i] = fp8_quantize_value(values[i], *scale);
  return codes;
}

struct Errors {
  double quantization;    // exact product of the E4M3 operands vs the unquantized product
  double fast, promoted;  // GEMM output vs the exact product of the E4M3 operands
};

// y = x · wᵀ for x [m, k], w [n, k] drawn as N(0, 1) (x as |N(0, 1)| when `positive`: the
// one-signed activations after SiLU-like gates), through the FP8 GEMM with and without fast
// accumulation; errors are relative L2 over `samples` random outputs.
Errors measure(int64_t m, int64_t n, int64_t k, bool positive, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  for (float& v : x) v = positive ? std::fabs(normal(rng)) : normal(rng);
  for (float& v : w) v = normal(rng);
  float x_scale = 0.0f, w_scale = 0.0f;
  const std::vector<uint8_t> x8 = quantize(x, &x_scale), w8 = quantize(w, &w_scale);

  // Separate allocations: cuBLASLt takes scale pointers only 16-byte aligned.
  DeviceBytes x_dev(x8.size()), w_dev(w8.size()), y_dev(static_cast<size_t>(m * n * 2)),
      x_scale_dev(sizeof(float)), w_scale_dev(sizeof(float));
  EXPECT_EQ(cudaMemcpy(x_dev.data, x8.data(), x8.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(w_dev.data, w8.data(), w8.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(x_scale_dev.data, &x_scale, sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(w_scale_dev.data, &w_scale, sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);

  constexpr int kSamples = 4096;
  std::uniform_int_distribution<int64_t> row(0, m - 1), col(0, n - 1);
  std::vector<std::pair<int64_t, int64_t>> at(kSamples);
  for (auto& p : at) p = {row(rng), col(rng)};
  std::vector<float> exact(kSamples), unquantized(kSamples);
  for (int s = 0; s < kSamples; ++s) {
    double q = 0.0, u = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      const size_t xi = static_cast<size_t>(at[s].first * k + i),
                   wi = static_cast<size_t>(at[s].second * k + i);
      q += static_cast<double>(e4m3_to_f32(x8[xi])) * e4m3_to_f32(w8[wi]);
      u += static_cast<double>(x[xi]) * w[wi];
    }
    exact[s] = static_cast<float>(q * x_scale * w_scale);
    unquantized[s] = static_cast<float>(u);
  }

  auto gemm_error = [&](bool fast) -> double {
    cuda::GemmOptions options;
    options.fp8_fast_accumulation = fast;
    auto gemm = cuda::Gemm::create(nullptr, options);
    EXPECT_TRUE(gemm.ok()) << gemm.status();
    if (!gemm.ok()) return INFINITY;
    const cuda::Mat x_mat{x_dev.data, m, k, k}, w_mat{w_dev.data, n, k, k},
        y_mat{y_dev.data, m, n, n};
    const absl::Status status =
        (*gemm)->linear_fp8(x_mat, static_cast<const float*>(x_scale_dev.data), w_mat,
                            static_cast<const float*>(w_scale_dev.data), y_mat, false);
    EXPECT_TRUE(status.ok()) << status;
    std::vector<uint16_t> y(static_cast<size_t>(m * n));
    EXPECT_EQ(cudaMemcpy(y.data(), y_dev.data, y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> sampled(kSamples);
    for (int s = 0; s < kSamples; ++s)
      sampled[s] = bf16_bits_value(y[static_cast<size_t>(at[s].first * n + at[s].second)]);
    return relative_l2_error(sampled, exact);
  };
  return Errors{relative_l2_error(exact, unquantized), gemm_error(true), gemm_error(false)};
}

class Fp8AccumulationTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(Fp8AccumulationTest, FastAccumulationErrorIsSmallAgainstOperandQuantization) {
  FLUX2_REQUIRE_GPU(be);
  const auto [k, positive] = GetParam();
  const Errors e = measure(1024, 1024, k, positive, static_cast<uint32_t>(k) + positive);
  std::printf(
      "K=%lld %s activations: operand quantization %.3e; accumulation fast %.3e, fp32-promoted "
      "%.3e\n",
      static_cast<long long>(k), positive ? "non-negative" : "zero-mean", e.quantization, e.fast,
      e.promoted);
  // The promoted accumulation is fp32 plus the bf16 output rounding: at most 2^-8 (bf16's unit
  // roundoff) plus k · 2^-24 (a worst-case fp32 sum), relative.
  EXPECT_LE(e.promoted, std::ldexp(1.0, -8) + static_cast<double>(k) * std::ldexp(1.0, -24));
  EXPECT_LE(e.fast, kAccumulationShareOfQuantization * e.quantization);
}

// K of the FLUX.2 GEMMs: 3072 (most of klein-4B's), 12288 (klein-4B's single-block output
// projection, [attn | mlp]), 24576 (dev's).
INSTANTIATE_TEST_SUITE_P(FluxReductionLengths, Fp8AccumulationTest,
                         ::testing::Combine(::testing::Values(3072, 12288, 24576),
                                            ::testing::Bool()));

}  // namespace
}  // namespace flux2
