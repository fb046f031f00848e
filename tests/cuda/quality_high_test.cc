// quality=high (FP8 GEMMs in the transformer blocks) at klein-4B shapes with random weights: the
// transformer output stays within the bound of the lossless output (target <= 5e-2 relative,
// failing above 1e-1), and enabling high in the process leaves lossless results byte-identical.
#include <cmath>

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
  EXPECT_EQ(testing::bits(*be, lossless), lossless_before) << "enabling quality=high changed a lossless result";
  const Tensor high = run(Quality::kHigh);
  const double error = relative_l2_error(testing::values(*be, high), testing::values(*be, lossless));
  std::printf("klein-4B transformer output, high vs lossless: relative L2 error %.4e (target %.0e, fail above %.0e), "
              "FP8 weights %.2f GB\n", error, kTarget, kFailAbove, *fp8_bytes / 1e9);
  EXPECT_GT(error, 0.0) << "the FP8 path did not run";
  EXPECT_LE(error, kFailAbove);
  if (error > kTarget) std::printf("note: above the %.0e target\n", kTarget);
}

}  // namespace
}  // namespace flux2
