// flux2_server on the GPU (issue 6): serves a checkpoint directory in the Hugging Face layout —
// $FLUX2_GPU_MODEL_DIR (klein-4B shapes, random weights, written by flux2_make_random_checkpoint;
// 1024x1024 requests) or else the tiny checkpoint of tests/data (256x256) — answers requests at
// both qualities with valid PNGs, and its metrics show the GPU memory gauges and the per-step
// histogram. Skips only where no GPU exists.
#include <cstdlib>

#include <gtest/gtest.h>

#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>

#include "tests/cuda/gpu_test_util.h"
#include "tests/server/test_support.h"

namespace flux2 {
namespace {

using server::testing::local_channel;
using server::testing::metric_value;
using server::testing::ServerProcess;

TEST(ServerGpuTest, ServesACheckpointDirectoryOnTheGpu) {
  FLUX2_REQUIRE_GPU(be);
  const char* real_size_dir = std::getenv("FLUX2_GPU_MODEL_DIR");
  const std::string model_dir = real_size_dir != nullptr
                                    ? real_size_dir
                                    : testing::test_data_dir() + "/tiny-klein/checkpoint";
  const int size = real_size_dir != nullptr ? 1024 : 256;
  const char* binary = std::getenv("FLUX2_SERVER_BINARY");
  auto server = ServerProcess::start(
      binary != nullptr ? binary : FLUX2_SERVER_BINARY,
      {"--model-dir", model_dir, "--backend", "cuda", "--enable-quality-high"});
  ASSERT_NE(server, nullptr);
  auto channel = local_channel(server->grpc_port());
  ASSERT_TRUE(server::testing::wait_for_health(channel, "readiness", "SERVING"));
  auto stub = v1::ImageGeneration::NewStub(channel);

  for (v1::Quality quality : {v1::QUALITY_LOSSLESS, v1::QUALITY_HIGH}) {
    v1::GenerateImageRequest request;
    request.set_prompt("a red fox in fresh snow, watercolor");
    request.set_width(size);
    request.set_height(size);
    request.set_seed(7);
    request.set_quality(quality);
    v1::GenerateImageResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->GenerateImage(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.images_size(), 1);
    const std::string& png = response.images(0).data();
    int w = 0, h = 0, channels = 0;
    stbi_uc* pixels = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(png.data()),
                                            static_cast<int>(png.size()), &w, &h, &channels, 3);
    ASSERT_NE(pixels, nullptr);
    stbi_image_free(pixels);
    EXPECT_EQ(w, size);
    EXPECT_EQ(h, size);
    const v1::Timings& t = response.timings();
    std::printf(
        "%s %dx%d: total %.1f ms (queue %.1f, text encode %.1f, denoise %.1f, decode %.1f, encode "
        "%.1f)\n",
        quality == v1::QUALITY_HIGH ? "high" : "lossless", size, size, 1e3 * t.total_seconds(),
        1e3 * t.queue_seconds(), 1e3 * t.text_encode_seconds(), 1e3 * t.denoise_seconds(),
        1e3 * t.decode_seconds(), 1e3 * t.encode_seconds());
  }
  const std::string metrics = server::testing::http_get(server->metrics_port(), "/metrics");
  // The weights alone: 14 GB at klein-4B shapes, 21 MB for the tiny checkpoint.
  EXPECT_GT(metric_value(metrics, "flux2_gpu_memory_used_bytes").value_or(0),
            real_size_dir != nullptr ? 1e9 : 1e7);
  EXPECT_GT(metric_value(metrics, "flux2_gpu_memory_total_bytes").value_or(0), 1e10);
  // Two requests of 4 steps each (the warm-up is not a request).
  EXPECT_GE(metric_value(metrics, "flux2_denoise_step_duration_seconds_count").value_or(0), 8.0);
  server->send_signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(std::chrono::seconds(120)), 0);
}

}  // namespace
}  // namespace flux2
