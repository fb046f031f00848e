// Device faults and stalls through the whole Server in process, fake engine (the same faults on
// the real CUDA backend: tests/cuda/server_gpu_test.cc on the H200): out of device memory fails
// only its request, a broken device ends serving (liveness off at once, queued requests
// UNAVAILABLE, WaitForStopRequest says why), a stalled stage turns liveness off until it ends;
// and the StallWatchdog alone. Run: build/bin/server_unit_tests
// --gtest_filter='Fault*:StallWatchdog*'
#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "server/app/server.h"
#include "server/serving/stall_watchdog.h"
#include "tests/server/server_fixture.h"
#include "tests/server/test_support.h"

namespace flux2::server {
namespace {

namespace v1 = flux2::v1;
using testing::health_status;
using testing::small_request;
using testing::StreamCall;
using testing::UnaryCall;
using testing::wait_for_health;

class FaultTest : public testing::FakeServerTest {
 protected:
  std::optional<double> metric(const std::string& name,
                               const std::map<std::string, std::string>& labels = {}) {
    return testing::metric_value(testing::http_get(server_->metrics_port(), "/metrics"), name,
                                 labels);
  }
};

TEST_F(FaultTest, OutOfDeviceMemoryFailsOnlyItsRequest) {
  options_.test_fault = TestFault{InjectedFault::kDeviceOutOfMemory, 1, 0.0, "device_oom@1"};
  start();
  UnaryCall failed(stub_.get(), small_request(1, 3));
  const grpc::Status status = failed.finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("out of device memory"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(control_->faults_injected(), 1);
  // Its own label, apart from a full queue; counted once as a fault too.
  EXPECT_TRUE(wait_metric("flux2_resource_exhausted_total", {{"reason", "device_memory"}}, 1.0));
  EXPECT_EQ(metric("flux2_resource_exhausted_total", {{"reason", "queue_full"}}), 0.0);
  EXPECT_EQ(metric("flux2_engine_faults_total", {{"kind", "device_memory"}}), 1.0);
  EXPECT_EQ(
      metric("flux2_requests_total", {{"method", "GenerateImage"}, {"code", "RESOURCE_EXHAUSTED"}}),
      1.0);
  // Nothing else changed: still live and ready, and the next request succeeds.
  EXPECT_EQ(health_status(channel_, "liveness"), "SERVING");
  EXPECT_EQ(health_status(channel_, "readiness"), "SERVING");
  UnaryCall next(stub_.get(), small_request(2, 3));
  EXPECT_TRUE(next.finish().ok());
  EXPECT_EQ(control_->faults_injected(), 1) << "the fault is injected once";
}

TEST_F(FaultTest, BrokenDeviceEndsServing) {
  options_.test_fault = TestFault{InjectedFault::kIllegalAddress, 1, 0.0, "illegal_address@1"};
  start();
  const int warm_up_generations = control_->generations();
  control_->close_gate();
  StreamCall running(stub_.get(), small_request(1, 3));
  control_->allow_steps(1);
  ASSERT_TRUE(running.wait_progress(1));  // the fault is armed before step 2, held at the gate
  UnaryCall queued(stub_.get(), small_request(2, 2));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 1.0));
  control_->open_gate();

  const grpc::Status status = running.finish();
  const auto failed_at = std::chrono::steady_clock::now();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  EXPECT_NE(status.error_message().find("the GPU is unusable"), std::string::npos)
      << status.error_message();
  // Liveness off within a second (Kubernetes restarts the pod), readiness too.
  ASSERT_TRUE(wait_for_health(channel_, "liveness", "NOT_SERVING"));
  EXPECT_LT(std::chrono::steady_clock::now() - failed_at, std::chrono::seconds(1));
  EXPECT_EQ(health_status(channel_, "readiness"), "NOT_SERVING");
  // The queued request at once, and new ones, get UNAVAILABLE saying why.
  const grpc::Status queued_status = queued.finish();
  EXPECT_EQ(queued_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(queued_status.error_message().find("the GPU failed"), std::string::npos)
      << queued_status.error_message();
  UnaryCall later(stub_.get(), small_request(3));
  EXPECT_EQ(later.finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(control_->generations(), warm_up_generations + 1) << "the failed request only";
  // The process is told to exit non-zero.
  const absl::Status fatal = server_->WaitForStopRequest();
  EXPECT_TRUE(absl::IsInternal(fatal)) << fatal;
  EXPECT_NE(fatal.message().find("the GPU failed: INTERNAL: the CUDA context is broken"),
            std::string::npos)
      << fatal;
  EXPECT_TRUE(wait_metric("flux2_engine_faults_total", {{"kind", "device_error"}}, 1.0));
  EXPECT_EQ(
      metric("flux2_requests_total", {{"method", "GenerateImageStream"}, {"code", "INTERNAL"}}),
      1.0);
  EXPECT_EQ(metric("flux2_ready"), 0.0);
  // The drain has nothing left to wait for.
  EXPECT_TRUE(server_->GracefulStop(Clock::now() + std::chrono::seconds(60)).ok());
}

TEST_F(FaultTest, StalledStageTurnsLivenessOffUntilItEnds) {
  // A fake step takes ~1 ms: 1 s is max(1 s, 2 x 1 ms).
  options_.stall = StallPolicy{1.0, 2.0};
  start();
  control_->close_gate();
  StreamCall running(stub_.get(), small_request(1, 3));
  control_->allow_steps(1);
  ASSERT_TRUE(running.wait_progress(1));
  // Step 2 is held at the gate: a hung step.
  ASSERT_TRUE(wait_for_health(channel_, "liveness", "NOT_SERVING"));
  EXPECT_EQ(health_status(channel_, "readiness"), "NOT_SERVING");
  EXPECT_EQ(metric("flux2_engine_stalled"), 1.0);
  EXPECT_EQ(metric("flux2_engine_faults_total", {{"kind", "stall"}}), 1.0);
  EXPECT_NE(testing::http_get(server_->http_port(), "/health").find("the engine is stalled"),
            std::string::npos);
  // It was slow, not dead: the step ends, the request succeeds, the server is live again.
  control_->open_gate();
  EXPECT_TRUE(running.finish().ok());
  ASSERT_TRUE(wait_for_health(channel_, "liveness", "SERVING"));
  EXPECT_TRUE(wait_for_health(channel_, "readiness", "SERVING"));
  EXPECT_TRUE(wait_metric("flux2_engine_stalled", {}, 0.0));
  EXPECT_EQ(metric("flux2_engine_faults_total", {{"kind", "stall"}}), 1.0);
  UnaryCall next(stub_.get(), small_request(2, 3));
  EXPECT_TRUE(next.finish().ok());
}

TEST(StallWatchdog, FiresOncePerStalledStageAndRecovers) {
  std::atomic<int> stalls{0}, recoveries{0};
  std::string request_id;
  double limit = 0.0;
  StallWatchdog watchdog(
      StallPolicy{0.2, 10.0},
      [&](const Stall& stall) {
        request_id = stall.request_id;
        limit = stall.limit_seconds;
        ++stalls;
      },
      [&] { ++recoveries; });
  // 10 x 50 ms expected: stalled after 0.5 s, once however long it lasts.
  watchdog.stage_started("req-1", 0.05);
  const auto until = std::chrono::steady_clock::now() + testing::kTestWaitLimit;
  while (stalls == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(stalls, 1);
  EXPECT_EQ(request_id, "req-1");
  EXPECT_DOUBLE_EQ(limit, 0.5);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(stalls, 1);
  EXPECT_EQ(recoveries, 0);
  watchdog.idle();
  while (recoveries == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(recoveries, 1);
  // Idle is never a stall; stages that keep ending in time neither.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  for (int i = 0; i < 10; ++i) {
    watchdog.stage_started("req-2", 10.0);  // limit 100 s
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  watchdog.idle();
  EXPECT_EQ(stalls, 1);
}

}  // namespace
}  // namespace flux2::server
