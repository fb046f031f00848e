// quality=high producer hand-off (kernels/cuda/cuda_backend_impl.h, AmaxHandoff): an FP8 GEMM
// reading the output of the op just before it takes the scale from that op's row maxima (bit for
// bit the GEMM with an unrelated op in between, which ends the hand-off: attention + SwiGLU into
// [attn | mlp], row ranges) or the E4M3 copy LayerNorm+modulate wrote with a bound scale (checked
// against the CPU conversion, never saturating, and close to the GEMM without it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/base/fast_path_registry.h"
#include "kernels/base/fp8_nvfp4.h"
#include "kernels/base/numerics.h"
#include "kernels/base/uniform_hash.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/norms.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using testing::bits;
using testing::random_bf16;

// These hand-offs belong to per-tensor FP8 GEMMs (FLUX2_FP8_ROWWISE=0), set before the shared
// backend is created; fp8_rows_test.cc covers the rowwise default.
const bool kPerTensorScales = [] { return setenv("FLUX2_FP8_ROWWISE", "0", 1) == 0; }();

int64_t handoffs() {
  return testing::fast_path_counters("fp8_amax_handoff").invocations;
}

class Fp8HandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be_ = testing::gpu_backend(&why);
    if (be_ == nullptr) GTEST_SKIP() << "no usable CUDA GPU: " << why;
    ASSERT_TRUE(kPerTensorScales);
    be_->set_quality(Quality::kHigh);
  }
  void TearDown() override {
    if (be_ != nullptr) be_->set_quality(Quality::kLossless);
  }
  // Runs produce() then consume(); then again with an unrelated op between them. Both consumer
  // outputs must be identical and only the first may use hand-offs (`expected` of them).
  void expect_same_bits(const std::function<void()>& produce,
                        const std::function<Tensor()>& consume, int64_t expected) {
    const int64_t before = handoffs();
    produce();
    const Tensor with = consume();
    EXPECT_EQ(handoffs(), before + expected);
    produce();
    unrelated_op();
    const Tensor without = consume();
    EXPECT_EQ(handoffs(), before + expected) << "a hand-off survived an unrelated op";
    EXPECT_EQ(bits(*be_, with), bits(*be_, without));
  }
  Tensor fp8_weight(int64_t n, int64_t k, uint64_t seed) {
    return testing::fp8_weight(*be_, n, k, seed);
  }
  void unrelated_op() { testing::unrelated_op(*be_); }
  Backend* be_ = nullptr;
};

TEST_F(Fp8HandoffTest, LayerNormModulateToLinearUsesItsE4m3Copy) {
  const int64_t s = 300, d = 256, n = 384;
  Tensor x = random_bf16(*be_, s, d, 1), normed = be_->empty(DType::kBF16, {s, d}).value();
  Tensor shift = random_bf16(*be_, 1, d, 2).reshape({d}),
         scale = random_bf16(*be_, 1, d, 3).reshape({d});
  Tensor w = fp8_weight(n, d, 4), y = be_->empty(DType::kBF16, {s, n}).value();
  auto run = [&](bool handed_off) {
    EXPECT_TRUE(be_->layer_norm_modulate(x, shift, scale, 1e-6f, normed).ok());
    if (!handed_off) unrelated_op();
    EXPECT_TRUE(be_->linear(normed, w, {}, y).ok());
    return testing::values(*be_, y);
  };
  const int64_t before = handoffs();
  const std::vector<float> with = run(true), again = run(true);
  EXPECT_EQ(handoffs(), before + 2);
  const std::vector<float> without = run(false);
  EXPECT_EQ(handoffs(), before + 2);
  EXPECT_EQ(with, again) << "not deterministic";
  // Both sides are FP8 GEMMs of the same values under different per-tensor scales (the bound vs
  // the amax): each rounding is within 2^-4 relative, so they differ by at most 2 x 2^-4.
  const double difference = relative_l2_error(with, without);
  std::printf("LayerNorm E4M3 copy vs amax-scaled quantization, GEMM outputs: relative L2 %.3e\n",
              difference);
  EXPECT_LE(difference, 0.125);
}

TEST_F(Fp8HandoffTest, LayerNormE4m3CopyMatchesTheCpuConversionAndNeverSaturates) {
  // Rows built to reach the bound: one spike (|n| = sqrt(D - 1)), constant rows, random rows; a
  // large modulation scale and shift.
  const int64_t rows = 64, d = 512;
  std::vector<float> host(rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      const float noise = uniform_hash(77, static_cast<uint64_t>(r * d + c)) * 2.0f - 1.0f;
      host[r * d + c] = r % 3 == 0   ? (c == r % d ? 1000.0f : 0.0f)
                        : r % 3 == 1 ? 5.0f
                                     : noise * 40.0f;
    }
  }
  Tensor x = be_->empty(DType::kBF16, {rows, d}).value();
  ASSERT_TRUE(be_->upload(host.data(), DType::kF32, x).ok());
  Tensor shift = random_bf16(*be_, 1, d, 21, 3.0f), scale = random_bf16(*be_, 1, d, 22, 7.0f);
  Tensor out = be_->empty(DType::kBF16, {rows, d}).value();
  Tensor fp8 = be_->empty(DType::kU8, {rows * d}).value(),
         fp8_scale = be_->empty(DType::kF32, {1}).value();
  auto* cuda = static_cast<CudaBackend*>(be_);
  ASSERT_TRUE(cuda::layer_norm_writes_fp8(mat(x)));
  ASSERT_TRUE(cuda::fp8_layer_norm_modulate_scale(mat(shift), mat(scale), d,
                                                  fp8_scale.data_as<float>(), cuda->stream())
                  .ok());
  ASSERT_TRUE(cuda::layer_norm_modulate_fused(
                  mat(x), mat(shift), mat(scale), rows, 1e-6f, mat(out), cuda->stream(), nullptr,
                  cuda::Fp8Rows{static_cast<uint8_t*>(fp8.data()), fp8_scale.data_as<float>()})
                  .ok());
  const std::vector<float> values = testing::values(*be_, out),
                           scale_value = testing::values(*be_, fp8_scale);
  const std::vector<float> codes_as_float = testing::values(*be_, fp8);  // u8 codes widen exactly
  float amax = 0.0f;
  for (float v : values) amax = std::max(amax, std::fabs(v));
  EXPECT_LE(amax, scale_value[0] * kE4M3Max) << "the bound scale saturates";
  std::printf("LayerNorm output amax %.3f, bound %.3f (%.1fx)\n", amax, scale_value[0] * kE4M3Max,
              scale_value[0] * kE4M3Max / amax);
  for (int64_t i = 0; i < rows * d; ++i) {
    const uint8_t want = fp8_quantize_value(values[i], scale_value[0]);
    ASSERT_EQ(static_cast<int>(codes_as_float[i]), static_cast<int>(want)) << "element " << i;
  }
}

TEST_F(Fp8HandoffTest, AttentionThenSwigluIntoOneConcatenation) {
  // The single block: attention writes [S, D] and SwiGLU [S, F] side by side; to_out reads both.
  const int64_t s = 256, heads = 2, dh = 128, d = heads * dh, f = 384;
  Tensor qkv = random_bf16(*be_, s, 3 * d, 5);
  Tensor mlp = random_bf16(*be_, s, 2 * f, 6, 2.0f);
  Tensor concat = be_->empty(DType::kBF16, {s, d + f}).value();
  Tensor w = fp8_weight(d, d + f, 7), y = be_->empty(DType::kBF16, {s, d}).value();
  const AttentionParams params{heads, heads, dh, 1.0f / std::sqrt(static_cast<float>(dh))};
  expect_same_bits(
      [&] {
        ASSERT_TRUE(be_->attention(qkv.col_slice(0, d), qkv.col_slice(d, d),
                                   qkv.col_slice(2 * d, d), params, concat.col_slice(0, d))
                        .ok());
        ASSERT_TRUE(
            be_->swiglu(mlp.col_slice(0, f), mlp.col_slice(f, f), concat.col_slice(d, f)).ok());
      },
      [&] {
        EXPECT_TRUE(be_->linear(concat, w, {}, y).ok());
        return testing::clone(*be_, y);
      },
      1);
}

TEST_F(Fp8HandoffTest, TwoRowRangesOfOneOutput) {
  // The double block: joint attention over [text; image], then one GEMM per stream on its rows.
  const int64_t l = 48, n = 208, s = l + n, heads = 2, dh = 128, d = heads * dh;
  Tensor qkv = random_bf16(*be_, s, 3 * d, 8), attn = be_->empty(DType::kBF16, {s, d}).value();
  Tensor w_txt = fp8_weight(d, d, 9), w_img = fp8_weight(d, d, 10);
  Tensor y = be_->empty(DType::kBF16, {s, d}).value();
  const AttentionParams params{heads, heads, dh, 1.0f / std::sqrt(static_cast<float>(dh))};
  expect_same_bits(
      [&] {
        ASSERT_TRUE(be_->attention(qkv.col_slice(0, d), qkv.col_slice(d, d),
                                   qkv.col_slice(2 * d, d), params, attn)
                        .ok());
      },
      [&] {
        EXPECT_TRUE(be_->linear(attn.row_slice(l, n), w_img, {}, y.row_slice(l, n)).ok());
        EXPECT_TRUE(be_->linear(attn.row_slice(0, l), w_txt, {}, y.row_slice(0, l)).ok());
        return testing::clone(*be_, y);
      },
      2);
}

TEST_F(Fp8HandoffTest, AWriteInBetweenEndsTheHandoff) {
  const int64_t s = 64, d = 128;
  Tensor x = random_bf16(*be_, s, d, 11), normed = be_->empty(DType::kBF16, {s, d}).value();
  Tensor shift = random_bf16(*be_, 1, d, 12).reshape({d}),
         scale = random_bf16(*be_, 1, d, 13).reshape({d});
  Tensor w = fp8_weight(d, d, 14), y = be_->empty(DType::kBF16, {s, d}).value();
  ASSERT_TRUE(be_->layer_norm_modulate(x, shift, scale, 1e-6f, normed).ok());
  Tensor bigger = random_bf16(*be_, s, d, 15, 100.0f);
  ASSERT_TRUE(be_->copy(bigger, normed).ok());  // new contents, 100x larger
  const int64_t before = handoffs();
  ASSERT_TRUE(be_->linear(normed, w, {}, y).ok());
  EXPECT_EQ(handoffs(), before) << "the GEMM used maxima of contents that were overwritten";
}

}  // namespace
}  // namespace flux2
