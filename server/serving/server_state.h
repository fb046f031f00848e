// The server's one state: a phase (loading, serving, draining, stopped, failed) plus the stall
// watchdog's verdict, and health(), the one function that turns it into liveness and readiness
// for gRPC's health service and HTTP's /health and /ready alike. Thread-safe.
// Tested by tests/server/server_state_test.cc and through tests/server/server_test.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/status/status.h"

namespace flux2::server {

enum class ServerPhase : uint8_t {
  kLoading,   // the model loads and warms up; nothing is admitted yet
  kServing,   // generation requests are admitted
  kDraining,  // stopping: admitted work finishes, new requests get UNAVAILABLE
  kStopped,   // drained; the process is about to exit
  kFailed,    // the model failed to load or the device broke: the process exits non-zero
};

// What the probes answer: OK, or UNAVAILABLE saying why not.
struct Health {
  absl::Status live;   // the process works: not failed, not stalled
  absl::Status ready;  // it takes generation requests: serving and not stalled
  bool operator==(const Health& other) const { return live == other.live && ready == other.ready; }
};

class ServerState {
 public:
  // `on_change` runs with the new health after every transition that changes it, on the thread
  // that made the transition, outside the state's lock.
  explicit ServerState(std::function<void(const Health&)> on_change = nullptr);

  ServerPhase phase() const;
  Health health() const;
  // Why the process must exit non-zero (set by failed()); OK otherwise.
  absl::Status fatal_error() const;

  void set_serving();   // loading -> serving
  void set_draining();  // -> draining (a failed server stays failed)
  void set_stopped();   // -> stopped (likewise)
  // -> failed, with why (its message is what liveness and the last log line say).
  void set_failed(absl::Status why);
  // The watchdog's verdict: a stage of the running request is far past its expected time.
  void set_stalled(bool stalled);

 private:
  template <typename Change>
  void transition(Change change);
  Health health_locked() const;

  const std::function<void(const Health&)> on_change_;
  mutable std::mutex mu_;
  ServerPhase phase_ = ServerPhase::kLoading;  // guarded by mu_
  absl::Status fatal_error_;                   // guarded by mu_
  bool stalled_ = false;                       // guarded by mu_
};

}  // namespace flux2::server
