// flux2_server on the GPU: serves a checkpoint directory in the Hugging Face layout —
// $FLUX2_GPU_MODEL_DIR (klein-4B shapes, random weights, written by flux2_make_random_checkpoint;
// 1024x1024 requests) or else the tiny checkpoint of tests/data (256x256) — answers requests at
// both qualities with valid PNGs, a QUALITY_HIGH response really made at high (quality echoed,
// FP8 paths counted, other bytes than lossless), no fast-path fallback at the real shapes (in the
// responses and in the metrics), GPU memory gauges, NVML telemetry and the per-step histogram;
// and with --fast-paths off the fused kernels run their eager chains (counted "switched_off", same
// bytes) while cuDNN attention keeps running; and the device faults (--test-inject-fault): out
// of memory, a sticky error, a hung step. Skips only where no CUDA device exists.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

std::string server_binary() {
  const char* binary = std::getenv("FLUX2_SERVER_BINARY");
  return binary != nullptr ? binary : FLUX2_SERVER_BINARY;
}

std::string tiny_checkpoint() {
  return testing::test_data_dir() + "/tiny-klein/checkpoint";
}

v1::GenerateImageRequest request_of(int size, v1::Quality quality) {
  v1::GenerateImageRequest request;
  request.set_prompt("a red fox in fresh snow, watercolor");
  request.set_width(size);
  request.set_height(size);
  request.set_seed(7);
  request.set_quality(quality);
  return request;
}

// Invocations and fallbacks ("path:reason") a response reports.
struct Usage {
  std::map<std::string, int64_t> invocations;
  std::map<std::string, int64_t> fallbacks;
};
Usage usage_of(const v1::GenerateImageResponse& response) {
  Usage usage;
  for (const v1::FastPathUsage& path : response.fast_paths()) {
    usage.invocations[path.path()] = path.invocations();
    for (const auto& [reason, count] : path.fallbacks()) {
      usage.fallbacks[path.path() + ":" + reason] = count;
    }
  }
  return usage;
}

// A started server that reports SERVING, with a stub, and its GetModelInfo answer.
struct Serving {
  std::unique_ptr<ServerProcess> process;
  std::unique_ptr<v1::ImageGeneration::Stub> stub;
  v1::GetModelInfoResponse info;
};
Serving start_serving(const std::vector<std::string>& args) {
  Serving s;
  s.process = ServerProcess::start(server_binary(), args);
  if (s.process == nullptr) return s;
  auto channel = local_channel(s.process->grpc_port());
  EXPECT_TRUE(server::testing::wait_for_health(channel, "readiness", "SERVING"));
  s.stub = v1::ImageGeneration::NewStub(channel);
  grpc::ClientContext context;
  EXPECT_TRUE(s.stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &s.info).ok());
  return s;
}

// Sum of every flux2_fast_path_fallbacks_total series.
double total_fallbacks(const std::string& metrics) {
  double total = 0.0;
  for (const auto& sample : server::testing::parse_prometheus_text(metrics)) {
    if (sample.name == "flux2_fast_path_fallbacks_total") total += sample.value;
  }
  return total;
}

TEST(ServerGpuTest, ServesACheckpointDirectoryOnTheGpu) {
  FLUX2_REQUIRE_GPU(be);
  const char* real_size_dir = std::getenv("FLUX2_GPU_MODEL_DIR");
  const bool real = real_size_dir != nullptr;
  const std::string model_dir = real ? real_size_dir : tiny_checkpoint();
  const int size = real ? 1024 : 256;
  Serving serving =
      start_serving({"--model-dir", model_dir, "--backend", "cuda", "--enable-quality-high"});
  ASSERT_NE(serving.process, nullptr);
  ServerProcess* server = serving.process.get();
  v1::ImageGeneration::Stub* stub = serving.stub.get();
  EXPECT_TRUE(serving.info.fast_paths_enabled());
  EXPECT_EQ(serving.info.backend_options().at("fp8-attention"), "on");
  EXPECT_EQ(serving.info.backend_options().at("gemm-autotune"), "off");

  std::map<v1::Quality, std::string> pngs;
  for (v1::Quality quality : {v1::QUALITY_LOSSLESS, v1::QUALITY_HIGH}) {
    v1::GenerateImageResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->GenerateImage(&context, request_of(size, quality), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.images_size(), 1);
    EXPECT_EQ(response.quality(), quality);
    const std::string& png = response.images(0).data();
    pngs[quality] = png;
    int w = 0, h = 0, channels = 0;
    stbi_uc* pixels = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(png.data()),
                                            static_cast<int>(png.size()), &w, &h, &channels, 3);
    ASSERT_NE(pixels, nullptr);
    stbi_image_free(pixels);
    EXPECT_EQ(w, size);
    EXPECT_EQ(h, size);
    const Usage usage = usage_of(response);
    if (quality == v1::QUALITY_HIGH) {
      // Every norm+projection pair of the blocks writes its GEMM's E4M3 rows at high.
      EXPECT_GT(
          usage.invocations.count("layer_norm_fp8") ? usage.invocations.at("layer_norm_fp8") : 0, 0)
          << "the QUALITY_HIGH response ran no FP8 path";
      if (real) {
        EXPECT_GT(usage.invocations.count("flash_attention_fp8"), 0u);
      }
    } else {
      EXPECT_EQ(usage.invocations.count("fp8_linear") + usage.invocations.count("layer_norm_fp8"),
                0u)
          << "a lossless request ran an FP8 path";
    }
    // At the real shapes every path serves every call: a healthy request reports no fallback.
    // (The tiny checkpoint's head_dim 32 is not the FP8 attention's 128: its fallback is real.)
    if (real) {
      EXPECT_EQ(response.fast_path_fallbacks(), 0) << ::testing::PrintToString(usage.fallbacks);
    }
    const v1::Timings& t = response.timings();
    std::printf(
        "%s %dx%d: total %.1f ms (queue %.1f, text encode %.1f, denoise %.1f, decode %.1f, encode "
        "%.1f), fallbacks %lld\n",
        quality == v1::QUALITY_HIGH ? "high" : "lossless", size, size, 1e3 * t.total_seconds(),
        1e3 * t.queue_seconds(), 1e3 * t.text_encode_seconds(), 1e3 * t.denoise_seconds(),
        1e3 * t.decode_seconds(), 1e3 * t.encode_seconds(),
        static_cast<long long>(response.fast_path_fallbacks()));
  }
  EXPECT_NE(pngs[v1::QUALITY_LOSSLESS], pngs[v1::QUALITY_HIGH])
      << "QUALITY_HIGH gave the lossless bytes";
  const std::string metrics = server::testing::http_get(server->metrics_port(), "/metrics");
  // The device-resident weights alone: 13 GB at klein-4B shapes, 5 MB for the tiny checkpoint
  // (the text encoder's embedding table stays in host memory: 0.8 GB and 19 MB).
  EXPECT_GT(metric_value(metrics, "flux2_gpu_memory_used_bytes").value_or(0), real ? 1e9 : 4e6);
  EXPECT_GT(metric_value(metrics, "flux2_gpu_memory_total_bytes").value_or(0), 1e10);
  // Two requests of 4 steps each (the warm-up is not a request).
  EXPECT_GE(metric_value(metrics, "flux2_denoise_step_duration_seconds_count").value_or(0), 8.0);
  // NVML telemetry of this GPU (server/ops/system_metrics.h), found by its PCI bus id: plausible
  // ranges for any datacenter GPU (an H200 idles near 75 W at ~1 GHz and runs at ~2 GHz).
  const std::optional<double> utilization = metric_value(metrics, "flux2_gpu_utilization_ratio");
  ASSERT_TRUE(utilization.has_value()) << "no NVML metrics: libnvidia-ml.so.1 not loaded?";
  EXPECT_GE(*utilization, 0.0);
  EXPECT_LE(*utilization, 1.0);
  EXPECT_GT(metric_value(metrics, "flux2_gpu_power_watts").value_or(0), 20.0);
  EXPECT_GT(metric_value(metrics, "flux2_gpu_sm_clock_hertz").value_or(0), 1e8);
  EXPECT_GT(metric_value(metrics, "flux2_gpu_memory_clock_hertz").value_or(0), 1e8);
  const double temperature = metric_value(metrics, "flux2_gpu_temperature_celsius").value_or(-1);
  EXPECT_GT(temperature, 5.0);
  EXPECT_LT(temperature, 100.0);
  EXPECT_GT(metric_value(metrics, "process_resident_memory_bytes").value_or(0), 1e8);
  EXPECT_GE(metric_value(metrics, "flux2_time_to_first_step_seconds_count").value_or(0), 2.0);
  // The warm-up and both requests (text encoder included) at the real shapes: no fallback at all.
  if (real) {
    EXPECT_EQ(total_fallbacks(metrics), 0.0);
  }
  server->send_signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(std::chrono::seconds(120)), 0);
}

// --fast-paths off: GetModelInfo says so, the fused kernels run their eager chains (counted
// "switched_off") with the same bytes as a server with them on, and cuDNN attention, an
// implementation rather than a fused kernel, keeps running (never "disabled_after_error").
TEST(ServerGpuTest, FastPathsOffRunsTheEagerChainsWithTheSameBytes) {
  FLUX2_REQUIRE_GPU(be);
  std::map<bool, std::string> pngs;
  for (const bool on : {true, false}) {
    Serving serving = start_serving(
        {"--model-dir", tiny_checkpoint(), "--backend", "cuda", "--fast-paths", on ? "on" : "off"});
    ASSERT_NE(serving.process, nullptr);
    ServerProcess* server = serving.process.get();
    v1::ImageGeneration::Stub* stub = serving.stub.get();
    EXPECT_EQ(serving.info.fast_paths_enabled(), on);
    v1::GenerateImageResponse response;
    grpc::ClientContext context;
    const grpc::Status status =
        stub->GenerateImage(&context, request_of(256, v1::QUALITY_LOSSLESS), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    pngs[on] = response.images(0).data();
    const Usage usage = usage_of(response);
    EXPECT_GT(
        usage.invocations.count("cudnn_attention") ? usage.invocations.at("cudnn_attention") : 0, 0)
        << "cuDNN attention must run with fast paths " << (on ? "on" : "off");
    for (const auto& [key, count] : usage.fallbacks) {
      EXPECT_EQ(key.find("disabled_after_error"), std::string::npos) << key;
      if (on) ADD_FAILURE() << "fallback with fast paths on: " << key << " " << count;
    }
    if (!on) {
      EXPECT_GT(usage.fallbacks.count("gate_residual:switched_off"), 0u)
          << ::testing::PrintToString(usage.fallbacks);
      EXPECT_EQ(
          usage.invocations.count("gate_residual") ? usage.invocations.at("gate_residual") : 0, 0);
    }
    server->send_signal(SIGTERM);
    EXPECT_EQ(server->wait_exit(std::chrono::seconds(120)), 0);
  }
  EXPECT_EQ(pngs[true], pngs[false]) << "fast paths changed a lossless result";
}

// ---- device faults (--test-inject-fault on the real CUDA backend, tiny checkpoint) -------------

// Out of device memory (the next allocation after step 1 asks the driver for more than the
// device has): that request fails with RESOURCE_EXHAUSTED naming device memory, its own metric
// labels count it, what it allocated is freed (the pool's used bytes as after a good request of
// the same prompt), and the next requests succeed with the same bytes as each other.
TEST(ServerGpuFaultTest, OutOfDeviceMemoryFailsOnlyItsRequest) {
  FLUX2_REQUIRE_GPU(be);
  Serving serving = start_serving({"--model-dir", tiny_checkpoint(), "--backend", "cuda",
                                   "--test-inject-fault", "device_oom@1"});
  ASSERT_NE(serving.process, nullptr);
  EXPECT_EQ(serving.info.test_inject_fault(), "device_oom@1");
  const int metrics_port = serving.process->metrics_port();
  const auto used = [&] {
    return metric_value(server::testing::http_get(metrics_port, "/metrics"),
                        "flux2_gpu_memory_used_bytes")
        .value_or(-1);
  };
  std::vector<std::string> pngs;
  std::vector<double> used_after;
  for (int i = 0; i < 3; ++i) {
    v1::GenerateImageResponse response;
    grpc::ClientContext context;
    const grpc::Status status =
        serving.stub->GenerateImage(&context, request_of(256, v1::QUALITY_LOSSLESS), &response);
    if (i == 0) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status.error_message();
      EXPECT_NE(status.error_message().find("out of device memory"), std::string::npos)
          << status.error_message();
    } else {
      ASSERT_TRUE(status.ok()) << status.error_message();
      pngs.push_back(response.images(0).data());
    }
    used_after.push_back(used());
  }
  EXPECT_EQ(pngs[0], pngs[1]);
  EXPECT_EQ(used_after[0], used_after[1]) << "the failed request left device memory behind";
  EXPECT_EQ(used_after[1], used_after[2]);
  const std::string metrics = server::testing::http_get(metrics_port, "/metrics");
  EXPECT_EQ(metric_value(metrics, "flux2_resource_exhausted_total", {{"reason", "device_memory"}}),
            1.0);
  EXPECT_EQ(metric_value(metrics, "flux2_resource_exhausted_total", {{"reason", "queue_full"}}),
            0.0);
  EXPECT_EQ(metric_value(metrics, "flux2_engine_faults_total", {{"kind", "device_memory"}}), 1.0);
  EXPECT_EQ(server::testing::health_status(local_channel(serving.process->grpc_port()), "liveness"),
            "SERVING");
  serving.process->send_signal(SIGTERM);
  EXPECT_EQ(serving.process->wait_exit(std::chrono::seconds(120)), 0);
}

// A sticky CUDA error (a kernel writes to an unmapped address before step 2): the running
// request fails with INTERNAL, liveness turns NOT_SERVING within a second, the queued request
// gets UNAVAILABLE, and the process exits 1 on its own.
TEST(ServerGpuFaultTest, StickyErrorEndsTheProcess) {
  FLUX2_REQUIRE_GPU(be);
  // 300 ms per step: time to queue a second request behind the first.
  Serving serving =
      start_serving({"--model-dir", tiny_checkpoint(), "--backend", "cuda", "--test-inject-fault",
                     "illegal_address@2", "--test-step-delay-ms", "300"});
  ASSERT_NE(serving.process, nullptr);
  auto channel = local_channel(serving.process->grpc_port());
  v1::GenerateImageRequest request = request_of(256, v1::QUALITY_LOSSLESS);
  request.set_num_inference_steps(4);
  server::testing::StreamCall running(serving.stub.get(), request);
  ASSERT_TRUE(running.wait_progress(1));
  server::testing::UnaryCall queued(serving.stub.get(), request);
  const grpc::Status status = running.finish();
  const auto failed_at = std::chrono::steady_clock::now();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  EXPECT_NE(status.error_message().find("cudaErrorIllegalAddress"), std::string::npos)
      << status.error_message();
  // The health service may already be gone when the process exits fast: NOT_SERVING or an error.
  std::string live = server::testing::health_status(channel, "liveness");
  while (live == "SERVING" &&
         std::chrono::steady_clock::now() - failed_at < std::chrono::seconds(5))
    live = server::testing::health_status(channel, "liveness");
  EXPECT_NE(live, "SERVING");
  EXPECT_LT(std::chrono::steady_clock::now() - failed_at, std::chrono::seconds(1));
  const grpc::Status queued_status = queued.finish();
  EXPECT_EQ(queued_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << queued_status.error_message();
  EXPECT_EQ(serving.process->wait_exit(std::chrono::seconds(60)), 1);
}

// A hung step (a kernel spinning 6 s before step 2, against a 1 s watchdog floor): liveness
// NOT_SERVING and flux2_engine_stalled 1 during it; the request then succeeds and the server is
// live again.
TEST(ServerGpuFaultTest, HungStepTurnsLivenessOffUntilItEnds) {
  FLUX2_REQUIRE_GPU(be);
  Serving serving =
      start_serving({"--model-dir", tiny_checkpoint(), "--backend", "cuda", "--test-inject-fault",
                     "hang@2:6", "--stall-timeout-min-s", "1", "--stall-step-multiple", "10"});
  ASSERT_NE(serving.process, nullptr);
  EXPECT_EQ(serving.info.stall_timeout_min_seconds(), 1.0);
  auto channel = local_channel(serving.process->grpc_port());
  v1::GenerateImageRequest request = request_of(256, v1::QUALITY_LOSSLESS);
  server::testing::StreamCall running(serving.stub.get(), request);
  ASSERT_TRUE(running.wait_progress(2));
  const auto hang_start = std::chrono::steady_clock::now();
  ASSERT_TRUE(server::testing::wait_for_health(channel, "liveness", "NOT_SERVING"));
  EXPECT_LT(std::chrono::steady_clock::now() - hang_start, std::chrono::seconds(3));
  const int metrics_port = serving.process->metrics_port();
  EXPECT_EQ(
      metric_value(server::testing::http_get(metrics_port, "/metrics"), "flux2_engine_stalled"),
      1.0);
  EXPECT_TRUE(running.finish().ok());
  EXPECT_GE(std::chrono::steady_clock::now() - hang_start, std::chrono::seconds(5));
  EXPECT_TRUE(server::testing::wait_for_health(channel, "liveness", "SERVING"));
  EXPECT_TRUE(server::testing::wait_for_metric(metrics_port, "flux2_engine_stalled", {}, 0.0));
  EXPECT_EQ(metric_value(server::testing::http_get(metrics_port, "/metrics"),
                         "flux2_engine_faults_total", {{"kind", "stall"}}),
            1.0);
  serving.process->send_signal(SIGTERM);
  EXPECT_EQ(serving.process->wait_exit(std::chrono::seconds(120)), 0);
}

}  // namespace
}  // namespace flux2
