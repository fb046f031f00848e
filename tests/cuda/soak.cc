// gpu_soak: the server on the GPU under mixed traffic for a fixed time (a soak test): sizes
// 256-1024, 1-4 images, both qualities, unary and streaming, cancels and deadlines mixed in, from
// K concurrent clients; every 30 s one JSON line of device memory, RSS, open fds, step times and
// codes. Exit 1 on any unexpected status or a server exit other than 0. Run by
// tests/gpu/run_on_device.sh soak (not a ctest: it is the measurement).
//   gpu_soak SERVER_BINARY MODEL_DIR SECONDS CLIENTS
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/test_support.h"

namespace flux2 {
namespace {

namespace v1 = flux2::v1;
using server::testing::http_get;
using server::testing::metric_value;
using Clock = std::chrono::steady_clock;

struct Tally {
  std::mutex mu;
  std::map<std::string, int64_t> codes;  // "OK", "CANCELLED", ...
  int64_t unexpected = 0;
  int64_t images = 0;
};

// One client: random requests until `end`.
void client(int index, int grpc_port, Clock::time_point end, Tally& tally) {
  std::mt19937_64 rng(1000 + index);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  auto channel = server::testing::local_channel(grpc_port);
  auto stub = v1::ImageGeneration::NewStub(channel);
  const int sizes[] = {256, 512, 768, 1024};
  while (Clock::now() < end) {
    v1::GenerateImageRequest request;
    request.set_prompt(pick(2) ? "a red fox in fresh snow, watercolor" : "a lighthouse at dusk");
    const int size = sizes[pick(4)];
    request.set_width(size);
    request.set_height(pick(4) == 0 ? size / 2 : size);
    request.set_num_images(1 + pick(4));
    request.set_seed(rng());
    request.set_quality(pick(2) ? v1::QUALITY_HIGH : v1::QUALITY_LOSSLESS);
    const int kind = pick(10);  // 0: cancel, 1: deadline, else runs to the end
    const bool stream = pick(2) == 0;
    grpc::Status status;
    int images = 0;
    if (stream && kind != 1) {
      server::testing::StreamCall call(stub.get(), request);
      if (kind == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50 + pick(500)));
        call.cancel();
      }
      status = call.finish();
      images = static_cast<int>(call.images().size());
    } else {
      const auto timeout = std::chrono::milliseconds(kind == 1 ? 200 + pick(1500) : 0);
      server::testing::UnaryCall call(stub.get(), request, timeout);
      if (kind == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50 + pick(500)));
        call.cancel();
      }
      status = call.finish();
      images = call.response().images_size();
    }
    const grpc::StatusCode code = status.error_code();
    const bool expected = code == grpc::StatusCode::OK ||
                          (kind == 0 && code == grpc::StatusCode::CANCELLED) ||
                          (kind == 1 && code == grpc::StatusCode::DEADLINE_EXCEEDED);
    std::lock_guard<std::mutex> lock(tally.mu);
    ++tally.codes[std::to_string(static_cast<int>(code))];
    if (code == grpc::StatusCode::OK) tally.images += images;
    if (!expected) {
      ++tally.unexpected;
      std::printf("UNEXPECTED code %d (%s) for %dx%d x%d %s %s kind %d\n", static_cast<int>(code),
                  status.error_message().c_str(), request.width(), request.height(),
                  request.num_images(), stream ? "stream" : "unary",
                  request.quality() == v1::QUALITY_HIGH ? "high" : "lossless", kind);
      std::fflush(stdout);
    }
  }
}

int run(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: gpu_soak SERVER_BINARY MODEL_DIR SECONDS CLIENTS\n");
    return 2;
  }
  const int seconds = std::stoi(argv[3]);
  const int clients = std::stoi(argv[4]);
  auto process = server::testing::ServerProcess::start(
      argv[1], {"--model-dir", argv[2], "--backend", "cuda", "--enable-quality-high",
                "--max-response-bytes", "67108864", "--queue-depth", "16"});
  if (process == nullptr) return 1;
  auto channel = server::testing::local_channel(process->grpc_port());
  if (!server::testing::wait_for_health(channel, "readiness", "SERVING")) return 1;
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::seconds(seconds);
  Tally tally;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] { client(i, process->grpc_port(), end, tally); });
  }
  double last_sum[2] = {0, 0}, last_count[2] = {0, 0};
  const char* qualities[2] = {"lossless", "high"};
  for (int t = 30; Clock::now() < end; t += 30) {
    std::this_thread::sleep_until(start + std::chrono::seconds(std::min(t, seconds)));
    const std::string metrics = http_get(process->metrics_port(), "/metrics");
    std::string steps;
    for (int q = 0; q < 2; ++q) {
      const std::map<std::string, std::string> label = {{"quality", qualities[q]}};
      const double sum =
          metric_value(metrics, "flux2_denoise_step_duration_seconds_sum", label).value_or(0);
      const double count =
          metric_value(metrics, "flux2_denoise_step_duration_seconds_count", label).value_or(0);
      char part[128];
      std::snprintf(
          part, sizeof(part), "\"%s_steps\": %.0f, \"%s_mean_ms\": %.2f, ", qualities[q],
          count - last_count[q], qualities[q],
          count > last_count[q] ? 1e3 * (sum - last_sum[q]) / (count - last_count[q]) : 0.0);
      steps += part;
      last_sum[q] = sum;
      last_count[q] = count;
    }
    std::lock_guard<std::mutex> lock(tally.mu);
    std::string codes;
    for (const auto& [code, n] : tally.codes)
      codes += "\"" + code + "\": " + std::to_string(n) + ", ";
    std::printf(
        "{\"t_s\": %d, \"gpu_used_bytes\": %.0f, \"gpu_peak_bytes\": %.0f, \"rss_bytes\": %.0f, "
        "\"open_fds\": %.0f, %s\"images\": %lld, \"unexpected\": %lld, \"codes\": {%s}}\n",
        std::min(t, seconds), metric_value(metrics, "flux2_gpu_memory_used_bytes").value_or(-1),
        metric_value(metrics, "flux2_gpu_memory_peak_bytes").value_or(-1),
        metric_value(metrics, "process_resident_memory_bytes").value_or(-1),
        metric_value(metrics, "process_open_fds").value_or(-1), steps.c_str(),
        static_cast<long long>(tally.images), static_cast<long long>(tally.unexpected),
        codes.substr(0, codes.size() >= 2 ? codes.size() - 2 : 0).c_str());
    std::fflush(stdout);
  }
  for (std::thread& thread : threads) thread.join();
  process->send_signal(SIGTERM);
  const int exit_code = process->wait_exit(std::chrono::seconds(120));
  std::printf("soak: %d s, %d clients, %lld unexpected, server exit %d\n", seconds, clients,
              static_cast<long long>(tally.unexpected), exit_code);
  return tally.unexpected == 0 && exit_code == 0 ? 0 : 1;
}

}  // namespace
}  // namespace flux2

int main(int argc, char** argv) {
  return flux2::run(argc, argv);
}
