// The published shapes: parameter counts, FLOPs and floors (model/README.md) and the random-weight
// pipelines of `flux2 bench --e2e`.
#include "model/flux2_presets.h"
#include "model/pipeline_presets.h"

#include <gtest/gtest.h>

namespace flux2 {
namespace {

TEST(Flux2PresetsTest, ParameterCountsMatchArchitecture) {
  EXPECT_EQ(flux2_parameter_count(flux2_preset("dev").value()), 32'223'281'152);
  EXPECT_EQ(flux2_parameter_count(flux2_preset("klein-4b").value()), 3'875'544'576);
  EXPECT_EQ(flux2_parameter_count(flux2_preset("klein-9b").value()), 9'078'581'248);
  EXPECT_FALSE(flux2_preset("klein-2b").ok());
}

TEST(Flux2PresetsTest, FloorsMatchPerformanceDoc) {
  // About 50 / 110 / 380 ms at 1024² with 512 text tokens.
  EXPECT_NEAR(flux2_floor_ms(flux2_preset("klein-4b").value(), 4096, 512), 50.0, 1.5);
  EXPECT_NEAR(flux2_floor_ms(flux2_preset("klein-9b").value(), 4096, 512), 110.0, 3.0);
  EXPECT_NEAR(flux2_floor_ms(flux2_preset("dev").value(), 4096, 512), 380.0, 10.0);
  // klein-4B forward: 28.3 TFLOP linear, 6.5 TFLOP attention.
  const StepFlops flops = flux2_step_flops(flux2_preset("klein-4b").value(), 4096, 512);
  EXPECT_NEAR(flops.linear / 1e12, 28.3, 0.1);
  EXPECT_NEAR(flops.attention / 1e12, 6.5, 0.1);
}

// The random-weight pipelines of `flux2 bench --e2e`: each model's transformer preset, its text
// encoder's published dimensions and taps (Qwen3-4B / 8B, taps 9/18/27; dev: Mistral-Small-3.x
// 24B, taps 10/20/30 of 40 layers) and the published VAE; an unknown model is an error.
TEST(PipelinePresetsTest, TextEncodersAndTapsPerModel) {
  auto klein = random_pipeline_spec("klein-4b", "/tokenizer");
  ASSERT_TRUE(klein.ok()) << klein.status();
  EXPECT_EQ(klein->transformer.hidden(), 3072);
  EXPECT_EQ(klein->text_encoder.hidden_size, 2560);
  EXPECT_EQ(klein->taps, (std::vector<int64_t>{9, 18, 27}));
  EXPECT_EQ(klein->text_encoder.hidden_size * 3, klein->transformer.joint_attention_dim);
  auto nine = random_pipeline_spec("klein-9b", "/tokenizer");
  ASSERT_TRUE(nine.ok());
  EXPECT_EQ(nine->text_encoder.hidden_size * 3, nine->transformer.joint_attention_dim);
  auto dev = random_pipeline_spec("dev", "/tokenizer");
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ(dev->text_encoder.hidden_size, 5120);
  EXPECT_EQ(dev->text_encoder.num_hidden_layers, 40);
  EXPECT_EQ(dev->taps, (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(dev->text_encoder.hidden_size * 3, dev->transformer.joint_attention_dim);
  EXPECT_EQ(dev->vae.latent_channels, 32);
  EXPECT_FALSE(random_pipeline_spec("klein-2b", "/tokenizer").ok());
}

}  // namespace
}  // namespace flux2
