// The drain (the SIGTERM path) of the whole Server in process, fake engine: in-flight and queued
// work finishes while new work is refused; past the drain deadline what is left is cancelled; and
// idle client connections (a gRPC channel, an HTTP keep-alive connection) do not hold up the exit.
// Run: build/bin/server_unit_tests --gtest_filter='DrainTest*'
#include <httplib.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "server/app/server.h"
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

class DrainTest : public testing::FakeServerTest {};

TEST_F(DrainTest, DrainFinishesInFlightWorkAndRefusesNewWork) {
  start();
  control_->close_gate();
  StreamCall running(stub_.get(), small_request(1, 3));
  control_->allow_steps(1);
  ASSERT_TRUE(running.wait_progress(1));
  UnaryCall queued(stub_.get(), small_request(2, 2));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 1.0));

  absl::Status drained = absl::UnknownError("not run");
  std::thread stopper(
      [&] { drained = server_->GracefulStop(Clock::now() + std::chrono::seconds(120)); });
  ASSERT_TRUE(wait_for_health(channel_, "readiness", "NOT_SERVING"));
  EXPECT_EQ(health_status(channel_, "liveness"), "SERVING");
  UnaryCall refused(stub_.get(), small_request(3));
  EXPECT_EQ(refused.finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  control_->open_gate();
  EXPECT_TRUE(running.finish().ok());
  EXPECT_TRUE(queued.finish().ok());
  stopper.join();
  EXPECT_TRUE(drained.ok()) << drained;
}

TEST_F(DrainTest, DrainTimeoutCancelsWhatIsLeft) {
  // Slow steps (test-only delay) so the running request is far from done at the drain deadline:
  // 200 steps x 100 ms = 20 s against a 200 ms drain bound.
  options_.test_step_delay_s = 0.1;
  start();
  StreamCall running(stub_.get(), small_request(1, 200));
  ASSERT_TRUE(running.wait_progress(1));
  UnaryCall queued(stub_.get(), small_request(2, 2));
  ASSERT_TRUE(wait_metric("flux2_queue_depth", {}, 1.0));
  const absl::Status drained = server_->GracefulStop(Clock::now() + std::chrono::milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(drained)) << drained;
  EXPECT_EQ(queued.finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  const grpc::Status status = running.finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(running.progress().size(), 200u);
}

// A connected gRPC channel and an HTTP keep-alive connection, both idle, stay open through the
// drain. gRPC's shutdown grace and cpp-httplib's keep-alive timeout are 5 s each, so a drain that
// waited on them would take more than 5 s (7 s and more with the metrics server's stop, which
// polls in 2 s quanta: civetweb's SOCKET_TIMEOUT_QUANTUM). With nothing to finish it takes that
// 2 s at most; the bound leaves room for a slow sanitizer build.
TEST_F(DrainTest, IdleConnectionsDoNotHoldUpTheExit) {
  start();
  UnaryCall done(stub_.get(), small_request(1, 1));  // the channel has carried a call
  ASSERT_TRUE(done.finish().ok());
  httplib::Client http("127.0.0.1", server_->http_port());
  http.set_keep_alive(true);
  httplib::Result health = http.Get("/health");
  ASSERT_TRUE(health);
  ASSERT_EQ(health->status, 200);
  const auto start = Clock::now();
  EXPECT_TRUE(server_->GracefulStop(Clock::now() + std::chrono::seconds(60)).ok());
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 4.5);
  server_.reset();
}

}  // namespace
}  // namespace flux2::server
