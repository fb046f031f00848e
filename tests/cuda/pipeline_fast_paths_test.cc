// A full tiny-checkpoint generation on the GPU with fast paths on and off: identical latents
// after every step and identical pixels (byte equality), so lossless fast paths change nothing.
#include <gtest/gtest.h>

#include "model/pipeline.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

struct GenerationRecord {
  std::vector<std::vector<uint16_t>> latents;
  std::vector<uint8_t> rgb;
};

GenerationRecord generate(Backend& be, Pipeline& pipeline, bool fast_paths) {
  GenerateParams params;
  params.prompt = "a red fox in the snow, watercolor";
  params.width = 80;
  params.height = 48;
  params.num_inference_steps = 4;
  params.seed = 7;
  params.fast_paths = fast_paths;
  GenerationRecord run;
  GenerateHooks hooks;
  hooks.on_latents = [&](int64_t, const Tensor& latents) { run.latents.push_back(testing::bits(be, latents)); };
  auto image = pipeline.generate(params, hooks);
  EXPECT_TRUE(image.ok()) << image.status();
  if (image.ok()) run.rgb = image->rgb;
  return run;
}

TEST(PipelineFastPathsTest, TinyCheckpointLatentsIdenticalWithFastPathsOnAndOff) {
  FLUX2_REQUIRE_GPU(be);
  auto pipeline = Pipeline::load(*be, testing::test_data_dir() + "/tiny-klein/checkpoint");
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  const GenerationRecord fast = generate(*be, **pipeline, true);
  const GenerationRecord eager = generate(*be, **pipeline, false);
  ASSERT_EQ(fast.latents.size(), 5u);  // initial noise + 4 steps
  ASSERT_EQ(eager.latents.size(), fast.latents.size());
  for (size_t i = 0; i < fast.latents.size(); ++i) EXPECT_EQ(fast.latents[i], eager.latents[i]) << "step " << i - 1;
  EXPECT_EQ(fast.rgb, eager.rgb);
  EXPECT_NE(fast.latents.front(), fast.latents.back());  // the steps did something
}

}  // namespace
}  // namespace flux2
