// The fixture the in-process server tests share: a Server on free loopback ports (gRPC, metrics,
// HTTP) over the fake engine whose steps, decodes and load the test controls, with a gRPC stub;
// stopped with a drain at the end of each test. Used by server_test.cc, http_api_test.cc,
// drain_test.cc, fault_test.cc and malformed_request_test.cc.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/app/server.h"
#include "tests/server/fake_engine.h"
#include "tests/server/test_support.h"

namespace flux2::server::testing {

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    control_ = std::make_shared<FakeEngineControl>();
    options_.host = "127.0.0.1";
    options_.port = 0;
    options_.metrics_port = 0;
    options_.http_port = 0;
    options_.warmup_steps = 1;
  }

  // Creates and starts the server from options_ (not waiting for readiness).
  void start_server() {
    absl::StatusOr<std::unique_ptr<Server>> server =
        Server::Create(options_, fake_engine_factory(control_));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_TRUE(server_->Start().ok());
  }

  // start_server(), then a gRPC channel and stub to it; waits for readiness unless `wait_ready`
  // is false.
  void start(bool wait_ready = true) {
    start_server();
    if (!server_) return;
    channel_ = local_channel(server_->grpc_port());
    stub_ = flux2::v1::ImageGeneration::NewStub(channel_);
    if (wait_ready) {
      ASSERT_TRUE(wait_for_health(channel_, "readiness", "SERVING"));
    }
  }

  bool wait_metric(const std::string& name, const std::map<std::string, std::string>& labels,
                   double value) {
    return wait_for_metric(server_->metrics_port(), name, labels, value);
  }

  void TearDown() override {
    control_->open_gate();
    control_->release_decode();
    control_->release_load();
    if (server_) server_->GracefulStop(Clock::now() + std::chrono::seconds(60)).IgnoreError();
  }

  ServerOptions options_;
  std::shared_ptr<FakeEngineControl> control_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<flux2::v1::ImageGeneration::Stub> stub_;
};

}  // namespace flux2::server::testing
