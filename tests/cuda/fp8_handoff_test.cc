// quality=high amax hand-off (kernels/cuda/cuda_backend_impl.h, AmaxHandoff): an FP8 GEMM reading
// the output of the op just before it takes the scale from that op's row maxima instead of an
// amax pass. Checked bit for bit against the same GEMM with an unrelated op in between (which
// ends the hand-off), for LayerNorm+modulate, attention + SwiGLU into [attn | mlp], and row ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kernels/base/fast_path_registry.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

using testing::bits;
using testing::random_bf16;

int64_t handoffs() {
  for (const FastPathCounters& c : fast_path_snapshot()) {
    if (c.path == "fp8_amax_handoff") return c.invocations;
  }
  return 0;
}

class Fp8HandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be_ = testing::gpu_backend(&why);
    if (be_ == nullptr) GTEST_SKIP() << "no usable CUDA GPU: " << why;
    be_->set_quality(Quality::kHigh);
  }
  void TearDown() override {
    if (be_ != nullptr) be_->set_quality(Quality::kLossless);
  }
  // An FP8-registered weight [n, k].
  Tensor fp8_weight(int64_t n, int64_t k, uint64_t seed) {
    Tensor w = random_bf16(*be_, n, k, seed, 0.05f);
    EXPECT_TRUE(be_->add_fp8_weight(w).ok());
    return w;
  }
  // Something unrelated in between: ends any hand-off.
  void unrelated_op() {
    Tensor a = random_bf16(*be_, 4, 16, 99), b = be_->empty(DType::kBF16, {4, 16}).value();
    ASSERT_TRUE(be_->silu(a, b).ok());
  }
  // Runs produce() then consume(); then again with an unrelated op between them. Both consumer
  // outputs must be identical and only the first may use hand-offs (`expected` of them).
  void expect_same_bits(const std::function<void()>& produce, const std::function<Tensor()>& consume,
                        int64_t expected) {
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
  Backend* be_ = nullptr;
};

TEST_F(Fp8HandoffTest, LayerNormModulateToLinear) {
  const int64_t s = 300, d = 256, n = 384;
  Tensor x = random_bf16(*be_, s, d, 1), normed = be_->empty(DType::kBF16, {s, d}).value();
  Tensor shift = random_bf16(*be_, 1, d, 2).reshape({d}), scale = random_bf16(*be_, 1, d, 3).reshape({d});
  Tensor w = fp8_weight(n, d, 4), y = be_->empty(DType::kBF16, {s, n}).value();
  expect_same_bits([&] { ASSERT_TRUE(be_->layer_norm_modulate(x, shift, scale, 1e-6f, normed).ok()); },
                   [&] {
                     EXPECT_TRUE(be_->linear(normed, w, {}, y).ok());
                     return testing::clone(*be_, y);
                   },
                   1);
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
        ASSERT_TRUE(be_->attention(qkv.col_slice(0, d), qkv.col_slice(d, d), qkv.col_slice(2 * d, d), params,
                                   concat.col_slice(0, d))
                        .ok());
        ASSERT_TRUE(be_->swiglu(mlp.col_slice(0, f), mlp.col_slice(f, f), concat.col_slice(d, f)).ok());
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
        ASSERT_TRUE(
            be_->attention(qkv.col_slice(0, d), qkv.col_slice(d, d), qkv.col_slice(2 * d, d), params, attn).ok());
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
  Tensor shift = random_bf16(*be_, 1, d, 12).reshape({d}), scale = random_bf16(*be_, 1, d, 13).reshape({d});
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
