// The server's state and its health; see server_state.h.
// Tested by tests/server/server_state_test.cc.
#include "server/serving/server_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace flux2::server {

ServerState::ServerState(std::function<void(const Health&)> on_change)
    : on_change_(std::move(on_change)) {}

ServerPhase ServerState::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

Health ServerState::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_locked();
}

absl::Status ServerState::fatal_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_error_;
}

Health ServerState::health_locked() const {
  const absl::Status stalled = absl::UnavailableError(
      "the engine is stalled: a stage of the running request is far past its expected time");
  Health health;
  if (!fatal_error_.ok()) {
    health.live = absl::UnavailableError(fatal_error_.message());
  } else if (stalled_) {
    health.live = stalled;
  }
  switch (phase_) {
    case ServerPhase::kServing:
      if (stalled_) health.ready = stalled;
      break;
    case ServerPhase::kLoading:
      health.ready = absl::UnavailableError("the model is still loading; retry later");
      break;
    case ServerPhase::kDraining:
    case ServerPhase::kStopped:
      health.ready =
          absl::UnavailableError("the server is shutting down; retry on another replica");
      break;
    case ServerPhase::kFailed:
      health.ready = absl::UnavailableError(
          absl::StrCat(fatal_error_.message(), "; retry on another replica"));
      break;
  }
  return health;
}

template <typename Change>
void ServerState::transition(Change change) {
  Health before, after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    before = health_locked();
    change();
    after = health_locked();
  }
  if (on_change_ && !(before == after)) on_change_(after);
}

void ServerState::set_serving() {
  transition([this] {
    if (phase_ == ServerPhase::kLoading) phase_ = ServerPhase::kServing;
  });
}

void ServerState::set_draining() {
  transition([this] {
    if (phase_ != ServerPhase::kFailed) phase_ = ServerPhase::kDraining;
  });
}

void ServerState::set_stopped() {
  transition([this] {
    if (phase_ != ServerPhase::kFailed) phase_ = ServerPhase::kStopped;
  });
}

void ServerState::set_failed(absl::Status why) {
  transition([this, &why] {
    phase_ = ServerPhase::kFailed;
    fatal_error_ = std::move(why);
  });
}

void ServerState::set_stalled(bool stalled) {
  transition([this, stalled] { stalled_ = stalled; });
}

}  // namespace flux2::server
