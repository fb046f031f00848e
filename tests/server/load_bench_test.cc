// server/cli/bench/load_bench.h over the fake engine: every phase's requests return OK with their
// images, the percentiles are ordered, and the numbers respect what the single worker guarantees
// (each request takes at least its steps' test delay, one request at a time); a request the server
// refuses fails the bench, naming the phase and the request.
#include <gtest/gtest.h>

#include <set>

#include "server/cli/bench/load_bench.h"
#include "tests/server/fake_engine.h"

namespace flux2::server {
namespace {

constexpr int kSteps = 2;
constexpr double kStepDelay = 0.02;  // seconds, ServerOptions::test_step_delay_s

ServerOptions fake_options() {
  ServerOptions options;
  options.warmup_steps = 1;
  options.test_step_delay_s = kStepDelay;
  options.queue_depth = 1;  // run_load_bench deepens it to the most clients
  return options;
}

TEST(LoadBench, PhasesReportWhatTheClientsSaw) {
  auto control = std::make_shared<testing::FakeEngineControl>();
  LoadBenchOptions options;
  options.clients = {1, 3};
  options.requests = 6;
  options.width = 64;
  options.height = 48;
  options.steps = kSteps;
  auto phases = run_load_bench(fake_options(), testing::fake_engine_factory(control), options);
  ASSERT_TRUE(phases.ok()) << phases.status();
  ASSERT_EQ(phases->size(), 2u);
  const double request_floor_ms = 1e3 * kSteps * kStepDelay;
  for (size_t p = 0; p < phases->size(); ++p) {
    const LoadBenchPhase& phase = (*phases)[p];
    SCOPED_TRACE(phase.to_json().dump());
    EXPECT_EQ(phase.clients, options.clients[p]);
    EXPECT_EQ(phase.requests, 6);
    EXPECT_EQ(phase.codes, (std::map<std::string, int>{{"OK", 6}}));
    EXPECT_EQ(phase.images, 6);
    EXPECT_LE(phase.p50_ms, phase.p90_ms);
    EXPECT_LE(phase.p90_ms, phase.p99_ms);
    EXPECT_LE(phase.p99_ms, phase.max_ms);
    EXPECT_GE(phase.p50_ms, request_floor_ms);  // every request sleeps through its steps
    EXPECT_LE(phase.mean_ms, phase.max_ms);
    // One worker: the phase lasts at least all its requests' steps back to back.
    EXPECT_GE(phase.wall_seconds, 6 * kSteps * kStepDelay);
    EXPECT_DOUBLE_EQ(phase.images_per_second, phase.images / phase.wall_seconds);
    EXPECT_TRUE(phase.collectives.empty()) << "one engine on one device: no collectives";
  }
  // The server's warm-ups (with and without a reference), the bench's warm-up request and the 12
  // timed requests, whose seeds are all distinct.
  EXPECT_EQ(control->generations(), 2 + 1 + 12);
  const std::vector<uint64_t> seeds = control->seeds();
  ASSERT_GE(seeds.size(), 12u);
  EXPECT_EQ(std::set<uint64_t>(seeds.end() - 12, seeds.end()).size(), 12u);
}

TEST(LoadBench, ARefusedRequestFailsTheBenchNamingIt) {
  auto control = std::make_shared<testing::FakeEngineControl>();
  LoadBenchOptions options;
  options.clients = {1};
  options.requests = 2;
  options.width = 65;  // not a multiple of 16
  options.height = 48;
  auto phases = run_load_bench(fake_options(), testing::fake_engine_factory(control), options);
  ASSERT_FALSE(phases.ok());
  EXPECT_NE(phases.status().message().find("request 0: code 3: width"), std::string::npos)
      << phases.status();
}

}  // namespace
}  // namespace flux2::server
