// A full tiny-checkpoint generation on the GPU with fast paths on and off: identical latents
// after every step and identical pixels (byte equality), so lossless fast paths change nothing,
// text-to-image and editing (plain and klein-KV); a lossless CFG request's pixels do not depend on
// a quality=high request served before it; a healthy klein-4B request, text-to-image and editing,
// counts no fallback at either quality.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/base/fast_path_registry.h"
#include "model/pipeline.h"
#include "model/pipeline_presets.h"
#include "tests/cuda/generation_record.h"

namespace flux2 {
namespace {

using testing::GenerationRecord;

GenerationRecord generate(Backend& be, Pipeline& pipeline, bool fast_paths,
                          Quality quality = Quality::kLossless, double guidance = -1.0,
                          std::vector<RgbImage> references = {}) {
  GenerateParams params;
  params.references = std::move(references);
  params.quality = quality;
  params.guidance_scale = guidance;
  params.prompt = "a red fox in the snow, watercolor";
  params.width = 80;
  params.height = 48;
  params.num_inference_steps = 4;
  params.seed = 7;
  params.fast_paths = fast_paths;
  return testing::record_generation(be, pipeline, params);
}

TEST(PipelineFastPathsTest, TinyCheckpointLatentsIdenticalWithFastPathsOnAndOff) {
  FLUX2_REQUIRE_GPU(be);
  auto pipeline = Pipeline::load(*be, testing::test_data_dir() + "/tiny-klein/checkpoint");
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  const GenerationRecord fast = generate(*be, **pipeline, true);
  const GenerationRecord eager = generate(*be, **pipeline, false);
  ASSERT_EQ(fast.latents.size(), 5u);  // initial noise + 4 steps
  ASSERT_EQ(eager.latents.size(), fast.latents.size());
  for (size_t i = 0; i < fast.latents.size(); ++i)
    EXPECT_EQ(fast.latents[i], eager.latents[i]) << "step " << i - 1;
  EXPECT_EQ(fast.rgb, eager.rgb);
  EXPECT_NE(fast.latents.front(), fast.latents.back());  // the steps did something
}

std::vector<RgbImage> golden_references() {
  std::vector<RgbImage> references;
  for (const char* name : {"ref1_64x80.png", "ref2_72x100.png"}) {
    const std::string path = testing::test_data_dir() + "/tiny-klein/references/" + name;
    auto reference = load_reference_file(path, 16, name);
    EXPECT_TRUE(reference.ok()) << reference.status();
    if (reference.ok()) references.push_back(*std::move(reference));
  }
  return references;
}

// Editing with two references, as the plain klein pipeline and as klein-KV: the lossless fast
// paths change no bit there either.
TEST(PipelineFastPathsTest, EditingLatentsIdenticalWithFastPathsOnAndOff) {
  FLUX2_REQUIRE_GPU(be);
  for (const bool kv : {false, true}) {
    PipelineOptions options;
    options.kv_cache = kv;
    auto pipeline =
        Pipeline::load(*be, testing::test_data_dir() + "/tiny-klein/checkpoint", options);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    const GenerationRecord fast =
        generate(*be, **pipeline, true, Quality::kLossless, -1.0, golden_references());
    const GenerationRecord eager =
        generate(*be, **pipeline, false, Quality::kLossless, -1.0, golden_references());
    const GenerationRecord plain = generate(*be, **pipeline, true);
    ASSERT_EQ(fast.latents.size(), 5u) << "kv " << kv;
    EXPECT_EQ(fast.latents, eager.latents) << "kv " << kv;
    EXPECT_EQ(fast.rgb, eager.rgb) << "kv " << kv;
    EXPECT_NE(fast.latents.back(), plain.latents.back()) << "the references changed nothing";
  }
}

// A CFG request (the tiny checkpoint loaded as a base model, negative prompt "") at lossless gives
// the same pixels in a fresh pipeline and in one that served a quality=high request first: the
// negative-prompt cache serves both qualities. The tiny checkpoint's activations round alike under
// the exact and the fast SiLU, so this equality alone could not catch a text encoder run at high
// (nor could checkpoints edited to have large gates: tried, they rounded alike too); the options
// each stage runs under are asserted directly by tests/host/pipeline_test.cc
// (EachStageRunsUnderItsRequestOptions), on every backend.
TEST(PipelineFastPathsTest, LosslessCfgRequestUnchangedByAnEarlierHighOne) {
  FLUX2_REQUIRE_GPU(be);
  PipelineOptions options;
  options.is_distilled = false;
  options.enable_quality_high = true;
  const std::string dir = testing::test_data_dir() + "/tiny-klein/checkpoint";
  auto fresh = Pipeline::load(*be, dir, options);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const GenerationRecord lossless = generate(*be, **fresh, true, Quality::kLossless, 4.0);
  auto served = Pipeline::load(*be, dir, options);
  ASSERT_TRUE(served.ok()) << served.status();
  const GenerationRecord high = generate(*be, **served, true, Quality::kHigh, 4.0);
  const GenerationRecord after_high = generate(*be, **served, true, Quality::kLossless, 4.0);
  ASSERT_FALSE(lossless.rgb.empty());
  EXPECT_EQ(after_high.rgb, lossless.rgb);
  EXPECT_EQ(after_high.latents, lossless.latents);
  EXPECT_NE(high.latents.back(), lossless.latents.back());  // the high request did run at high
}

// A healthy request at the real klein-4B shapes (random weights: Qwen3-4B text encoder, 5 + 20
// blocks, the VAE decoder; 1024 x 1024, 512 text tokens) counts no fast-path fallback at either
// quality: the text encoder's causal attention is not a fallback, and every path serves every call.
// Editing: one 1024 x 1024 reference (8704 joint tokens), plain and as klein-KV.
TEST(PipelineFastPathsTest, HealthyKlein4bRequestReportsNoFallbacks) {
  FLUX2_REQUIRE_GPU(be);
  auto spec = random_pipeline_spec("klein-4b",
                                   testing::test_data_dir() + "/tiny-klein/checkpoint/tokenizer");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->enable_quality_high = true;
  for (const int variant : {0, 1, 2})  // text-to-image, editing, klein-KV editing
    for (const Quality quality : {Quality::kLossless, Quality::kHigh}) {
      spec->kv_cache = variant == 2;
      auto pipeline = Pipeline::create_random(*be, *spec);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      GenerateParams params;
      params.prompt = "a red fox in fresh snow at golden hour, watercolor";
      params.num_inference_steps = 2;
      params.quality = quality;
      if (variant > 0) {
        params.references.push_back(
            RgbImage{1024, 1024, std::vector<uint8_t>(1024 * 1024 * 3, 128)});
      }
      SCOPED_TRACE(variant == 0 ? "text-to-image" : variant == 1 ? "editing" : "klein-KV editing");
      const std::vector<FastPathCounters> before = fast_path_snapshot();
      auto image = (*pipeline)->generate(params);
      ASSERT_TRUE(image.ok()) << image.status();
      int64_t ran = 0;
      for (const FastPathCounters& now : fast_path_snapshot()) {
        for (const FastPathCounters& then : before) {
          if (then.path != now.path) continue;
          ran += now.invocations - then.invocations;
          EXPECT_EQ(now.fallbacks, then.fallbacks)
              << now.path << " fell back at " << (quality == Quality::kHigh ? "high" : "lossless");
        }
      }
      EXPECT_GT(ran, 0);
    }
}

}  // namespace
}  // namespace flux2
