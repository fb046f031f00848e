// Helpers shared by the server tests: a minimal HTTP GET for /metrics, a Prometheus text parser,
// gRPC client helpers (health check, BadRequest field extraction), reference images (PNG / JPEG
// bytes built with model/image_encode.h) and a handle on a spawned flux2_server process (start,
// read its ports, signal, wait for its exit).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "flux2/v1/image_generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace flux2::server::testing {

// Generous bound for anything the tests wait for (never a pass/fail timing criterion).
constexpr auto kTestWaitLimit = std::chrono::seconds(120);

// ---- metrics -----------------------------------------------------------------------------------
// GET http://127.0.0.1:port/path; returns the body, or "" on any error.
std::string http_get(int port, const std::string& path);

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};
std::vector<MetricSample> parse_prometheus_text(const std::string& text);
// Sum over the samples called `name` whose labels include `labels`; nullopt when none matches.
std::optional<double> metric_value(const std::string& text, const std::string& name,
                                   const std::map<std::string, std::string>& labels = {});
// Polls /metrics until metric_value(...) == expected (true) or kTestWaitLimit passes (false).
bool wait_for_metric(int port, const std::string& name,
                     const std::map<std::string, std::string>& labels, double expected);

// ---- gRPC client
// ---------------------------------------------------------------------------------
std::shared_ptr<grpc::Channel> local_channel(int port);
// grpc.health.v1 Check; returns the status name ("SERVING", "NOT_SERVING") or the RPC error.
std::string health_status(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& service);
// Polls health_status until it equals `expected` (true) or kTestWaitLimit passes (false).
bool wait_for_health(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                     const std::string& expected);
// Field names of the google.rpc.BadRequest in a status's details (empty when there is none).
std::vector<std::string> bad_request_fields(const grpc::Status& status);
// A small valid request (64 x 48, fixed seed) for the tiny or the fake model.
flux2::v1::GenerateImageRequest small_request(uint64_t seed, int steps = 2);

// ---- reference images ---------------------------------------------------------------------------
// width x height x 3 bytes: pixel (x, y) channel c = (x * 5 + y * 11 + c * 70) mod 256, so no two
// neighbours are alike and a crop shows in the pixels.
std::vector<uint8_t> gradient_pixels(int64_t width, int64_t height);
// gradient_pixels encoded as PNG / JPEG (quality 90) bytes; fails the current test on error.
std::string gradient_png(int64_t width, int64_t height);
std::string gradient_jpeg(int64_t width, int64_t height);
// Incompressible pixels (a fixed pseudo-random sequence) as PNG: about width x height x 3 bytes.
std::string noise_png(int64_t width, int64_t height);
// Fails the current test unless `png` decodes to width x height RGB equal to the golden `tensor`
// of the safetensors file `golden` (CHW values, e.g. "case0.image_u8") up to one level on at most
// 0.5% of values (the image_u8 bar of tests/data/README.md).
void expect_golden_png(const std::string& png, const std::string& golden, const std::string& tensor,
                       int width, int height);

// A GenerateImage call running on its own thread.
class UnaryCall {
 public:
  // `timeout`: the call's deadline from now (none when zero). `token`: bearer token metadata.
  UnaryCall(flux2::v1::ImageGeneration::Stub* stub, flux2::v1::GenerateImageRequest request,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0),
            const std::string& token = "");
  ~UnaryCall();
  void cancel() { context_.TryCancel(); }
  bool done() const;
  // Joins the thread; returns the status.
  grpc::Status finish();
  const flux2::v1::GenerateImageResponse& response() const { return response_; }

 private:
  grpc::ClientContext context_;
  flux2::v1::GenerateImageResponse response_;
  grpc::Status status_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// A GenerateImageStream call read on its own thread.
class StreamCall {
 public:
  StreamCall(flux2::v1::ImageGeneration::Stub* stub, flux2::v1::GenerateImageRequest request);
  ~StreamCall();
  // Blocks until `n` progress events arrived (true) or the stream ended / kTestWaitLimit passed.
  bool wait_progress(int n);
  void cancel() { context_.TryCancel(); }
  bool done() const;
  grpc::Status finish();
  std::vector<flux2::v1::Progress> progress() const;
  // The result event (empty message when none came).
  flux2::v1::GenerateImageResponse result() const;
  // The image events, in arrival order.
  std::vector<flux2::v1::Image> images() const;
  // Events in arrival order: 'p' progress, 'i' image, 'r' result.
  std::string event_kinds() const;

 private:
  grpc::ClientContext context_;
  grpc::Status status_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<flux2::v1::Progress> progress_;
  flux2::v1::GenerateImageResponse result_;
  std::vector<flux2::v1::Image> images_;
  std::string kinds_;
  bool ended_ = false;
  std::thread thread_;
};

// ---- the flux2_server process
// --------------------------------------------------------------------
class ServerProcess {
 public:
  // Starts `binary` with `args` plus --host 127.0.0.1 --port 0 --metrics-port 0 --http-port 0 and
  // reads the bound ports from its "listening" line. Fails the current test when that does not
  // happen. A non-empty `stderr_path` receives the server's log (stderr).
  static std::unique_ptr<ServerProcess> start(const std::string& binary,
                                              const std::vector<std::string>& args,
                                              const std::string& stderr_path = "");
  ~ServerProcess();  // SIGKILLs a process still running

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }
  pid_t pid() const { return pid_; }
  void send_signal(int signal) const;
  // Waits for the exit; returns the exit code, 128 + signal when killed, -1 when still running
  // after `limit`.
  int wait_exit(std::chrono::seconds limit);

 private:
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
  bool exited_ = false;
};

}  // namespace flux2::server::testing
