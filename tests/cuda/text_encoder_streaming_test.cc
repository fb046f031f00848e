// The text encoder with its weights streamed from pinned host memory (the 80 GB memory plan) on
// the GPU: the same bits as the resident encoder, on the tiny FLUX.2-dev encoder and at
// Mistral-Small-3's real layer shapes (a few layers, so the copies of one layer really overlap the
// previous layer's compute), and the copies land before the layer that reads them.
#include <gtest/gtest.h>

#include <vector>

#include "model/checkpoint.h"
#include "model/text_encoder.h"
#include "tests/cuda/gpu_test_util.h"

namespace flux2 {
namespace {

std::vector<int32_t> prompt_ids(int64_t length, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(length), 11);  // <pad>
  for (int64_t i = 0; i < length * 3 / 4; ++i)
    ids[i] = static_cast<int32_t>((i * 7919 + 1) % vocab);
  return ids;
}

TEST(TextEncoderStreamingTest, TinyDevEncoderStreamedGivesTheResidentBits) {
  FLUX2_REQUIRE_GPU(be);
  auto weights =
      ComponentWeights::open(testing::test_data_dir() + "/tiny-flux2-dev/checkpoint/text_encoder");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto resident = TextEncoder::load(*be, *weights, {10, 20, 30}, WeightResidency::kDevice);
  auto streamed = TextEncoder::load(*be, *weights, {10, 20, 30}, WeightResidency::kStreamed);
  ASSERT_TRUE(resident.ok()) << resident.status();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_GT((*streamed)->host_bytes(), 0);
  const std::vector<int32_t> ids = prompt_ids(64, 131072);
  auto a = (*resident)->encode(ids, 48);
  auto b = (*streamed)->encode(ids, 48);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(testing::bits(*be, *b), testing::bits(*be, *a));
}

TEST(TextEncoderStreamingTest, RealMistralLayersStreamedGiveTheResidentBits) {
  FLUX2_REQUIRE_GPU(be);
  TextEncoderConfig config = TextEncoderConfig::mistral_small_3();
  config.num_hidden_layers = 5;  // 1.1 GB per layer: the copy of layer k+1 runs beside layer k
  const std::vector<int64_t> taps = {2, 4, 5};
  auto resident = TextEncoder::create_random(*be, config, taps, 3, WeightResidency::kDevice);
  ASSERT_TRUE(resident.ok()) << resident.status();
  auto streamed = TextEncoder::create_random(*be, config, taps, 3, WeightResidency::kStreamed);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  const std::vector<int32_t> ids = prompt_ids(512, config.vocab_size);
  for (int repeat = 0; repeat < 2; ++repeat) {  // the buffers are reused across encodes
    auto a = (*resident)->encode(ids, 384);
    auto b = (*streamed)->encode(ids, 384);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(testing::bits(*be, *b), testing::bits(*be, *a)) << "encode " << repeat;
  }
}

}  // namespace
}  // namespace flux2
