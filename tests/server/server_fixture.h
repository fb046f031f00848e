// The fixture the in-process server tests share: a Server on free loopback ports (gRPC, metrics,
// HTTP) over the fake engine whose steps, decodes and load the test controls; stopped with a
// drain at the end of each test. Used by server_test.cc, http_api_test.cc and drain_test.cc.
#pragma once

#include <chrono>
#include <memory>

#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/fake_engine.h"

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

  void TearDown() override {
    control_->open_gate();
    control_->release_decode();
    control_->release_load();
    if (server_) server_->GracefulStop(Clock::now() + std::chrono::seconds(60)).IgnoreError();
  }

  ServerOptions options_;
  std::shared_ptr<FakeEngineControl> control_;
  std::unique_ptr<Server> server_;
};

}  // namespace flux2::server::testing
