// The server's one state (server/serving/server_state.h): every phase's liveness and readiness,
// the stall verdict beside the phase, a failure that outlasts the drain, and the change listener.
// Run: build/bin/server_unit_tests --gtest_filter='ServerState*'
#include "server/serving/server_state.h"

#include <vector>

#include "gtest/gtest.h"

namespace flux2::server {
namespace {

TEST(ServerState, EveryPhaseHasItsHealth) {
  ServerState state;
  EXPECT_TRUE(state.health().live.ok());  // loading: alive, not ready
  EXPECT_TRUE(absl::IsUnavailable(state.health().ready));
  EXPECT_NE(state.health().ready.message().find("loading"), std::string::npos);
  state.set_serving();
  EXPECT_TRUE(state.health().live.ok());
  EXPECT_TRUE(state.health().ready.ok());
  state.set_draining();
  EXPECT_TRUE(state.health().live.ok());
  EXPECT_NE(state.health().ready.message().find("shutting down"), std::string::npos);
  state.set_stopped();
  EXPECT_EQ(state.phase(), ServerPhase::kStopped);
  EXPECT_TRUE(absl::IsUnavailable(state.health().ready));
}

TEST(ServerState, AStallTakesLivenessAndReadinessUntilItEnds) {
  ServerState state;
  state.set_serving();
  state.set_stalled(true);
  EXPECT_NE(state.health().live.message().find("stalled"), std::string::npos);
  EXPECT_NE(state.health().ready.message().find("stalled"), std::string::npos);
  EXPECT_EQ(state.phase(), ServerPhase::kServing);  // requests are still admitted
  state.set_stalled(false);
  EXPECT_TRUE(state.health().live.ok());
  EXPECT_TRUE(state.health().ready.ok());
}

TEST(ServerState, AFailureOutlastsTheDrainAndNamesWhy) {
  ServerState state;
  state.set_failed(absl::InternalError("the GPU failed: INTERNAL: illegal address"));
  state.set_draining();
  state.set_stopped();
  EXPECT_EQ(state.phase(), ServerPhase::kFailed);
  EXPECT_EQ(state.health().live.message(), "the GPU failed: INTERNAL: illegal address");
  EXPECT_NE(state.health().ready.message().find("retry on another replica"), std::string::npos);
  EXPECT_TRUE(absl::IsInternal(state.fatal_error()));
}

TEST(ServerState, TheListenerHearsEachChangeOnce) {
  std::vector<Health> heard;
  ServerState state([&heard](const Health& health) { heard.push_back(health); });
  state.set_serving();
  state.set_serving();  // no change
  state.set_stalled(true);
  state.set_stalled(false);
  ASSERT_EQ(heard.size(), 3u);
  EXPECT_TRUE(heard[0].ready.ok());
  EXPECT_FALSE(heard[1].live.ok());
  EXPECT_TRUE(heard[2].live.ok());
}

}  // namespace
}  // namespace flux2::server
