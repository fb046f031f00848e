// A full tiny-checkpoint generation on the GPU with fast paths on and off: identical latents
// after every step and identical pixels (byte equality), so lossless fast paths change nothing; a
// lossless CFG request's pixels do not depend on a quality=high request served before it (on a
// checkpoint where a leak would show); a healthy klein-4B request counts no fallback.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <cmath>

#include "kernels/base/dtype.h"
#include "kernels/base/fast_path_registry.h"
#include "kernels/base/uniform_hash.h"
#include "model/checkpoint.h"
#include "model/pipeline.h"
#include "model/pipeline_presets.h"
#include "model/qwen3_encoder.h"
#include "model/tokenizer.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

struct GenerationRecord {
  std::vector<std::vector<uint16_t>> latents;
  std::vector<uint8_t> rgb;
};

GenerationRecord generate(Backend& be, Pipeline& pipeline, bool fast_paths,
                          Quality quality = Quality::kLossless, double guidance = -1.0) {
  GenerateParams params;
  params.quality = quality;
  params.guidance_scale = guidance;
  params.prompt = "a red fox in the snow, watercolor";
  params.width = 80;
  params.height = 48;
  params.num_inference_steps = 4;
  params.seed = 7;
  params.fast_paths = fast_paths;
  GenerationRecord run;
  GenerateHooks hooks;
  hooks.on_latents = [&](int64_t, const Tensor& latents) {
    run.latents.push_back(testing::bits(be, latents));
  };
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
  for (size_t i = 0; i < fast.latents.size(); ++i)
    EXPECT_EQ(fast.latents[i], eager.latents[i]) << "step " << i - 1;
  EXPECT_EQ(fast.rgb, eager.rgb);
  EXPECT_NE(fast.latents.front(), fast.latents.back());  // the steps did something
}

// The tiny checkpoint with its text encoder's MLP gate weights replaced by uniform values of
// ±30·sqrt(3/d) and the RMSNorm in front of the MLP set to weight 1: on its unit-RMS outputs of
// width d the gate values then spread as a normal of standard deviation ~30, over the range where quality=high's fast SiLU rounds differently from
// the exact one (tests/cuda/quality_high_test.cc, gate in [-100, 100]), so a text encoder run at
// high gives other embeddings. (The plain tiny checkpoint's small activations round alike under
// both SiLUs, and scaling its gates only moved them to where both SiLUs agree again.)
std::string checkpoint_with_loud_text_encoder(const testing::TempDir& dir) {
  const std::string out = dir.path() + "/checkpoint";
  testing::copy_tree(testing::test_data_dir() + "/tiny-klein/checkpoint", out);
  const std::string file = out + "/text_encoder/model.safetensors";
  std::map<std::string, testing::RawTensor> tensors = testing::read_all_tensors(file);
  int replaced = 0;
  for (auto& [name, tensor] : tensors) {
    if (name.find("post_attention_layernorm.weight") != std::string::npos) {
      for (size_t i = 0; i + 1 < tensor.bytes.size(); i += 2) {  // bf16 1.0
        tensor.bytes[i] = 0x80;
        tensor.bytes[i + 1] = 0x3f;
      }
      continue;
    }
    if (name.find("mlp.gate_proj.weight") == std::string::npos) continue;
    EXPECT_EQ(tensor.dtype, "BF16");
    EXPECT_EQ(tensor.shape.size(), 2u);
    const float scale = 30.0f * std::sqrt(3.0f / static_cast<float>(tensor.shape.back()));
    for (size_t i = 0; i + 1 < tensor.bytes.size(); i += 2) {
      const float value = (2.0f * uniform_hash(replaced + 1, i / 2) - 1.0f) * scale;
      const uint16_t bits = f32_to_bf16_bits(value);
      tensor.bytes[i] = static_cast<uint8_t>(bits & 0xff);
      tensor.bytes[i + 1] = static_cast<uint8_t>(bits >> 8);
    }
    ++replaced;
  }
  EXPECT_GT(replaced, 0);
  testing::write_safetensors(file, tensors);
  return out;
}

// A CFG request (the tiny checkpoint loaded as a base model, negative prompt "") at lossless gives
// the same pixels in a fresh pipeline and in one that served a quality=high request first: the
// negative-prompt cache serves both qualities, so the text encoder must run at lossless inside
// every request. First the case shows it can catch a leak: its text encoder, run at high, gives
// other embeddings than at lossless.
TEST(PipelineFastPathsTest, LosslessCfgRequestUnchangedByAnEarlierHighOne) {
  FLUX2_REQUIRE_GPU(be);
  testing::TempDir temp;
  const std::string dir = checkpoint_with_loud_text_encoder(temp);
  {
    auto weights = ComponentWeights::open(dir + "/text_encoder");
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto encoder = Qwen3Encoder::load(*be, *weights);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    auto tokenizer = Tokenizer::load(dir + "/tokenizer");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const TokenizedPrompt tokens = tokenize_prompt(**tokenizer, "", 64);
    auto encode = [&](Quality quality) {
      const RequestScope request(*be, {quality});
      auto embeds = (*encoder)->encode(tokens.ids, tokens.num_tokens);
      EXPECT_TRUE(embeds.ok()) << embeds.status();
      return testing::bits(*be, *embeds);
    };
    ASSERT_NE(encode(Quality::kHigh), encode(Quality::kLossless))
        << "this checkpoint cannot show a text encoder run at high";
  }
  PipelineOptions options;
  options.is_distilled = false;
  options.enable_quality_high = true;
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
TEST(PipelineFastPathsTest, HealthyKlein4bRequestReportsNoFallbacks) {
  FLUX2_REQUIRE_GPU(be);
  auto spec = random_pipeline_spec("klein-4b", testing::test_data_dir() +
                                                   "/tiny-klein/checkpoint/tokenizer");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->enable_quality_high = true;
  auto pipeline = Pipeline::create_random(*be, *spec);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  for (const Quality quality : {Quality::kLossless, Quality::kHigh}) {
    GenerateParams params;
    params.prompt = "a red fox in fresh snow at golden hour, watercolor";
    params.num_inference_steps = 2;
    params.quality = quality;
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
