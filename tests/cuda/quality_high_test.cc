// quality=high at klein-4B shapes with random weights: the transformer output stays within the
// issue's bound of the lossless output (target <= 5e-2 relative, failing above 1e-1), enabling high
// leaves lossless results byte-identical, and the fast SiLU of SwiGLU and the VAE's GroupNorm stays
// within derived bf16-ulp bounds of the exact one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "kernels/base/numerics.h"
#include "model/flux2_presets.h"
#include "model/flux2_transformer.h"
#include "model/rope.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

constexpr double kFailAbove = 1e-1;  // issue 8: "the test fails above 1e-1"
constexpr double kTarget = 5e-2;     // issue 8: target

TEST(QualityHighTest, Klein4bTransformerOutputWithinBoundAndLosslessUnchanged) {
  FLUX2_REQUIRE_GPU(be);
  const Flux2Config config = flux2_preset("klein-4b").value();
  auto model = Flux2Transformer::create_random(*be, config, 5);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t h = 64, w = 64, n = h * w, l = 512;
  Tensor prompt = testing::random_bf16(*be, l, config.joint_attention_dim, 6);
  Tensor x = testing::random_bf16(*be, n, config.in_channels, 7);
  const std::vector<float> timesteps = {0.9f};
  auto cond = (*model)->prepare(prompt, flux2_text_ids(l), flux2_image_ids(h, w), timesteps, {});
  ASSERT_TRUE(cond.ok()) << cond.status();
  auto run = [&](Quality quality) {
    be->set_quality(quality);
    Tensor out = be->empty(DType::kBF16, {n, config.out_channels}).value();
    EXPECT_TRUE((*model)->forward(*cond, 0, x, out).ok());
    be->set_quality(Quality::kLossless);
    return out;
  };
  const std::vector<uint16_t> lossless_before = testing::bits(*be, run(Quality::kLossless));
  auto fp8_bytes = (*model)->enable_quality_high();
  ASSERT_TRUE(fp8_bytes.ok()) << fp8_bytes.status();
  EXPECT_GT(*fp8_bytes, 0);
  const Tensor lossless = run(Quality::kLossless);
  EXPECT_EQ(testing::bits(*be, lossless), lossless_before)
      << "enabling quality=high changed a lossless result";
  const Tensor high = run(Quality::kHigh);
  const double error =
      relative_l2_error(testing::values(*be, high), testing::values(*be, lossless));
  std::printf(
      "klein-4B transformer output, high vs lossless: relative L2 error %.4e (target %.0e, fail "
      "above %.0e), "
      "FP8 weights %.2f GB\n",
      error, kTarget, kFailAbove, *fp8_bytes / 1e9);
  EXPECT_GT(error, 0.0) << "the FP8 path did not run";
  EXPECT_LE(error, kFailAbove);
  if (error > kTarget) std::printf("note: above the %.0e target\n", kTarget);
}

// Checks |high - lossless| <= 2^-ulp_exponent · max(|high|, |lossless|) + 2^-100 for every element
// (the silu tests below derive the exponent) and returns how many differ; `what` names the case.
int64_t differing_within_bound(Backend& be, const Tensor& lossless, const Tensor& high,
                               int ulp_exponent, const std::string& what) {
  const std::vector<float> want = testing::values(be, lossless), got = testing::values(be, high);
  int64_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float bound = std::ldexp(std::max(std::fabs(want[i]), std::fabs(got[i])), -ulp_exponent) +
                        std::ldexp(1.0f, -100);
    EXPECT_LE(std::fabs(got[i] - want[i]), bound)
        << what << ", element " << i << ": high " << got[i] << ", lossless " << want[i];
    if (std::fabs(got[i] - want[i]) > bound) break;  // one element tells; the rest would flood
    differing += got[i] != want[i];
  }
  std::printf("%s: %.3f%% of outputs differ between quality=high and lossless\n", what.c_str(),
              100.0 * differing / want.size());
  return differing;
}

// SwiGLU at quality=high computes silu with __expf and __fdividef (cuda::SiluMath::kFast). For
// |g| < 100 that silu is within ~2^-16 of the exact one (__expf: 2 + 1.17 |g| ulp, __fdividef:
// 2 ulp), so bf16(silu) moves by at most one bf16 ulp (<= 2^-7 relative) and the product, after
// its own rounding, by at most two: |high - lossless| <= 2^-6 |lossless|. Below g = -87 the fast
// quotient is 0 where the exact one is below 2^-119 · |u|: the 2^-100 absolute term.
TEST(QualityHighTest, SwigluFastSiluWithinTwoBf16UlpsOfExact) {
  FLUX2_REQUIRE_GPU(be);
  int64_t differing = 0;  // over both ranges: in [-4, 4] the two silus rounded alike everywhere
  for (const float range : {4.0f, 100.0f}) {
    const int64_t rows = 1024, f = 9216;  // klein-4B's MLP width
    Tensor gate = testing::random_bf16(*be, rows, f, 11, range),
           up = testing::random_bf16(*be, rows, f, 12, 2.0f);
    Tensor exact = be->empty(DType::kBF16, {rows, f}).value(),
           fast = be->empty(DType::kBF16, {rows, f}).value();
    ASSERT_TRUE(be->swiglu(gate, up, exact).ok());
    const int64_t before = testing::fast_path_counters("swiglu").invocations;
    {
      testing::QualityScope high(*be, Quality::kHigh);
      ASSERT_TRUE(be->swiglu(gate, up, fast).ok());
    }
    ASSERT_GT(testing::fast_path_counters("swiglu").invocations, before)
        << "the fused SwiGLU did not run";
    differing += differing_within_bound(
        *be, exact, fast, 6,
        range < 10 ? "SwiGLU, gate in [-4, 4]" : "SwiGLU, gate in [-100, 100]");
  }
  EXPECT_GT(differing, 0) << "quality=high computed the exact silu";
}

// The VAE's GroupNorm + SiLU at quality=high: one rounding after the fast silu, so at most one bf16
// ulp (<= 2^-7 relative) from lossless; 2^-100 absolute for the flushed silu below -87.
TEST(QualityHighTest, GroupNormFastSiluWithinOneBf16UlpOfExact) {
  FLUX2_REQUIRE_GPU(be);
  const int64_t pixels = 64 * 64, channels = 512, groups = 32;  // a decoder mid-block shape
  Tensor x = testing::random_bf16(*be, pixels, channels, 13, 30.0f);
  // gamma up to 60: normalised values reach |y| ~ 100, where the fast silu's error (it grows with
  // |y|) shows and y < -87 takes the flushed quotient.
  Tensor gamma = testing::random_bf16(*be, 1, channels, 14, 60.0f).reshape({channels});
  Tensor beta = testing::random_bf16(*be, 1, channels, 15, 4.0f).reshape({channels});
  Tensor exact = be->empty(DType::kBF16, {pixels, channels}).value();
  Tensor fast = be->empty(DType::kBF16, {pixels, channels}).value();
  ASSERT_TRUE(be->group_norm(x, groups, gamma, beta, 1e-6f, /*silu=*/true, exact).ok());
  {
    testing::QualityScope high(*be, Quality::kHigh);
    ASSERT_TRUE(be->group_norm(x, groups, gamma, beta, 1e-6f, /*silu=*/true, fast).ok());
  }
  EXPECT_GT(differing_within_bound(*be, exact, fast, 7, "GroupNorm + SiLU"), 0)
      << "quality=high computed the exact silu";
}

}  // namespace
}  // namespace flux2
