// FP8 checkpoints' stored weights on the CUDA backend (Weight::stored_fp8): the E4M3 -> bf16
// dequantization gives the host loader's bits for every code and scale, a lossless linear on the
// stored codes (--fp8-lossless=per_layer) equals the one on the host-dequantized upload bit for
// bit, and quality=high runs the file's codes in the FP8 GEMM without a copy, within twice the
// CPU backend's same-precision emulation error, its activations per token or under a static
// input_scale (--fp8-input-scale static). Run:
// build-gpu/tests/cuda/gpu_fp8_stored_weight_test
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/base/dtype.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/numerics.h"
#include "kernels/base/uniform_hash.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using testing::bits;
using testing::random_bf16;
using testing::values;

// Codes [n, k]: every E4M3 code but the NaNs along each row (rotated by the row), then hashed ones.
std::vector<uint8_t> test_codes(int64_t n, int64_t k) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t code = c < 256 ? static_cast<uint8_t>(c + r)
                                   : static_cast<uint8_t>(uniform_hash(7, r * k + c) * 256.0f);
      codes[static_cast<size_t>(r * k + c)] = (code & 0x7f) == 0x7f ? 0 : code;
    }
  }
  return codes;
}

// Row scales spanning what checkpoints hold: amax / 448 of small and large weights, one value
// repeated (a per-tensor scale) for the first half, subnormal-range products too.
std::vector<float> test_scales(int64_t n) {
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    scales[static_cast<size_t>(r)] =
        r < n / 2 ? 3.1e-4f : std::ldexp(1.0f + 0.37f * static_cast<float>(r % 5), -20 + r % 23);
  }
  return scales;
}

// A stored FP8 weight on `be` from host codes and scales.
Weight stored_weight(Backend& be, const std::vector<uint8_t>& codes,
                     const std::vector<float>& scales, int64_t n, int64_t k) {
  Weight w;
  w.tensor = be.empty(DType::kF8E4M3, {n, k}).value();
  w.row_scales = be.empty(DType::kF32, {n}).value();
  EXPECT_TRUE(be.upload(codes.data(), DType::kF8E4M3, w.tensor).ok());
  EXPECT_TRUE(be.upload(scales.data(), DType::kF32, w.row_scales).ok());
  return w;
}

// The loader's host dequantization: float(W8) * s in f32 (dequantize_fp8).
std::vector<float> host_dequantized(const std::vector<uint8_t>& codes,
                                    const std::vector<float>& scales, int64_t n, int64_t k) {
  std::vector<float> out(codes.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      out[static_cast<size_t>(r * k + c)] =
          e4m3_to_f32(codes[static_cast<size_t>(r * k + c)]) * scales[static_cast<size_t>(r)];
  return out;
}

TEST(Fp8StoredWeight, DequantizeEveryCodeBitExact_n37_k512) {
  FLUX2_REQUIRE_GPU(be);
  constexpr int64_t n = 37, k = 512;
  const std::vector<uint8_t> codes = test_codes(n, k);
  const std::vector<float> scales = test_scales(n);
  const Weight w = stored_weight(*be, codes, scales, n, k);
  Tensor out = be->empty(DType::kBF16, {n, k}).value();
  ASSERT_TRUE(be->dequantize_e4m3_rows(w.tensor, w.row_scales, out).ok());
  const std::vector<float> expected = host_dequantized(codes, scales, n, k);
  const std::vector<uint16_t> got = bits(*be, out);
  int64_t differ = 0, nonzero = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    differ += got[i] != f32_to_bf16_bits(expected[i]);  // the upload's f32 -> bf16 conversion
    nonzero += expected[i] != 0.0f;
  }
  EXPECT_EQ(differ, 0) << "of " << expected.size();
  EXPECT_GT(nonzero, n * k / 2);  // not trivially zero
}

TEST(Fp8StoredWeight, DequantizeRefusesShapesItCannotLoad) {
  FLUX2_REQUIRE_GPU(be);
  Tensor codes = be->empty(DType::kF8E4M3, {4, 12}).value();  // 12 columns: not a multiple of 8
  Tensor scales = be->empty(DType::kF32, {4}).value();
  Tensor out = be->empty(DType::kBF16, {4, 12}).value();
  const absl::Status status = be->dequantize_e4m3_rows(codes, scales, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("multiples of 8"), std::string::npos) << status;
  Tensor few_scales = be->empty(DType::kF32, {3}).value();
  Tensor codes16 = be->empty(DType::kF8E4M3, {4, 16}).value();
  Tensor out16 = be->empty(DType::kBF16, {4, 16}).value();
  const absl::Status rows = be->dequantize_e4m3_rows(codes16, few_scales, out16);
  EXPECT_NE(rows.message().find("one row scale per row"), std::string::npos) << rows;
}

TEST(Fp8StoredWeight, LosslessLinearEqualsHostDequantizedUpload_m77_n96_k512) {
  FLUX2_REQUIRE_GPU(be);
  constexpr int64_t m = 77, n = 96, k = 512;
  const std::vector<uint8_t> codes = test_codes(n, k);
  const std::vector<float> scales(static_cast<size_t>(n), 2.0e-4f);
  const Weight stored = stored_weight(*be, codes, scales, n, k);
  const std::vector<float> dequantized = host_dequantized(codes, scales, n, k);
  Tensor plain = be->empty(DType::kBF16, {n, k}).value();
  ASSERT_TRUE(be->upload(dequantized.data(), DType::kF32, plain).ok());  // the loader's upload
  const Tensor x = random_bf16(*be, m, k, 11);
  Tensor y_stored = be->empty(DType::kBF16, {m, n}).value();
  Tensor y_plain = be->empty(DType::kBF16, {m, n}).value();
  for (Quality quality : {Quality::kLossless, Quality::kHigh}) {  // unregistered: bf16 at both
    const RequestScope request(*be, {quality});
    ASSERT_TRUE(be->linear(x, stored, {}, y_stored).ok());
    ASSERT_TRUE(be->linear(x, plain, {}, y_plain).ok());
    EXPECT_EQ(bits(*be, y_stored), bits(*be, y_plain));
  }
}

// quality=high's relative errors against the exact product on the dequantized weights (in
// double): the CUDA backend's and the CPU backend's same-precision emulation's.
struct QualityHighErrors {
  double cuda = 0.0, emulation = 0.0;
};

// y = x · wᵀ at quality=high, w the stored weight of `codes` and `scales` registered on the GPU
// and on the CPU emulation with `input_scale` (none: activations per token), x [m, k] random.
QualityHighErrors quality_high_errors(Backend& be, const std::vector<uint8_t>& codes,
                                      const std::vector<float>& scales, int64_t m, int64_t n,
                                      int64_t k, std::optional<float> input_scale) {
  Weight w = stored_weight(be, codes, scales, n, k);
  auto low = be.add_stored_fp8_weight(w.tensor, w.row_scales, input_scale);
  EXPECT_TRUE(low.ok()) << low.status();
  if (!low.ok()) return {};
  w.low_precision = *low;
  // Per-channel FP8 GEMMs (H100/H200) share the stored tensors; per-tensor ones quantize again
  // (a static scale adds its 4 bytes).
  const int64_t copy_bytes = (*low)->device_bytes() - (input_scale ? 4 : 0);
  EXPECT_TRUE(copy_bytes == 0 || copy_bytes >= n * k) << copy_bytes;

  CpuBackend cpu;
  Weight cpu_w = stored_weight(cpu, codes, scales, n, k);
  auto cpu_low = cpu.add_stored_fp8_weight(cpu_w.tensor, cpu_w.row_scales, input_scale);
  EXPECT_TRUE(cpu_low.ok()) << cpu_low.status();
  if (!cpu_low.ok()) return {};
  cpu_w.low_precision = *cpu_low;
  const Tensor x = random_bf16(be, m, k, 12);
  const std::vector<float> x_host = values(be, x);
  Tensor cpu_x = cpu.empty(DType::kF32, {m, k}).value();
  EXPECT_TRUE(cpu.upload(x_host.data(), DType::kF32, cpu_x).ok());

  Tensor y = be.empty(DType::kBF16, {m, n}).value();
  Tensor cpu_y = cpu.empty(DType::kF32, {m, n}).value();
  {
    const RequestScope request(be, {Quality::kHigh});
    const RequestScope cpu_request(cpu, {Quality::kHigh});
    EXPECT_TRUE(be.linear(x, w, {}, y).ok());
    EXPECT_TRUE(cpu.linear(cpu_x, cpu_w, {}, cpu_y).ok());
  }
  // The exact product on the dequantized weights, in double.
  const std::vector<float> deq = host_dequantized(codes, scales, n, k);
  std::vector<float> exact(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t c = 0; c < k; ++c)
        sum += double{x_host[static_cast<size_t>(i * k + c)]} * deq[static_cast<size_t>(j * k + c)];
      exact[static_cast<size_t>(i * n + j)] = static_cast<float>(sum);
    }
  std::vector<float> emulated(static_cast<size_t>(m * n));
  EXPECT_TRUE(cpu.download(cpu_y, emulated.data()).ok());
  return {relative_l2_error(values(be, y), exact), relative_l2_error(emulated, exact)};
}

// Row scales of q | k | v of a ModelOpt file: three scales in one weight.
std::vector<float> qkv_scales(int64_t n) {
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    scales[static_cast<size_t>(r)] = r < n / 3 ? 1.0e-4f : r < 2 * n / 3 ? 2.5e-4f : 6.0e-5f;
  return scales;
}

TEST(Fp8StoredWeight, QualityHighRunsTheFileCodes_m256_n192_k1024) {
  FLUX2_REQUIRE_GPU(be);
  constexpr int64_t m = 256, n = 192, k = 1024;
  const QualityHighErrors e =
      quality_high_errors(*be, test_codes(n, k), qkv_scales(n), m, n, k, std::nullopt);
  // P4 (c): twice the same-precision (E4M3 activations per token, the file's weight codes)
  // emulation's error, plus 2^-8 for the bf16 output's rounding (2^-9 relative) twice over.
  EXPECT_GT(e.emulation, 0.0);
  EXPECT_LE(e.cuda, 2.0 * e.emulation + 1.0 / 256) << "fp8 emulation error " << e.emulation;
}

// --fp8-input-scale static: the activation quantized per tensor under the checkpoint's
// input_scale (codes e4m3(x / input_scale)) on both backends; x is uniform in [-1, 1], so a
// calibrated amax of 1.25 leaves headroom and one of 0.5 saturates the larger half at ±448.
TEST(Fp8StoredWeight, QualityHighStaticInputScaleWithinTheEmulationBound_m256_n192_k1024) {
  FLUX2_REQUIRE_GPU(be);
  constexpr int64_t m = 256, n = 192, k = 1024;
  for (const float amax : {1.25f, 0.5f}) {
    SCOPED_TRACE(::testing::Message() << "input_scale = " << amax << " / 448");
    const QualityHighErrors e =
        quality_high_errors(*be, test_codes(n, k), qkv_scales(n), m, n, k, amax / kE4M3Max);
    // The same bound as per token: twice the same-precision emulation's error (E4M3 activations
    // under the static scale, the file's weight codes) plus 2^-8 for the bf16 output.
    EXPECT_GT(e.emulation, 0.0);
    EXPECT_LE(e.cuda, 2.0 * e.emulation + 1.0 / 256) << "fp8 emulation error " << e.emulation;
  }
}

TEST(Fp8StoredWeight, StaticInputScaleMustBeFiniteAndPositive) {
  FLUX2_REQUIRE_GPU(be);
  const Weight w = stored_weight(*be, test_codes(16, 32), test_scales(16), 16, 32);
  for (const float bad : {0.0f, -1.0f, std::nanf("")}) {
    auto low = be->add_stored_fp8_weight(w.tensor, w.row_scales, bad);
    ASSERT_FALSE(low.ok());
    EXPECT_NE(low.status().message().find("input_scale"), std::string::npos) << low.status();
  }
}

}  // namespace
}  // namespace flux2
