// TestApplication: the Application the transport tests serve (tests/server/http_transport_test.cc).
// Routes: GET /health -> "ok"; POST /echo -> "<body length>:<first 16 bytes>"; POST /slow and
// GET|POST /stream are held until the test answers them (wait_held); GET /big -> a 64 MiB body;
// /refuse -> 401 from check_head; anything else -> 404 from check_head. It records refusals,
// handle() calls and on_gone callbacks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "server/http/transport/transport.h"

namespace flux2::server::http::testing {

class TestApplication : public Application {
 public:
  std::optional<Response> check_head(const RequestHead& head) override;
  void handle(std::shared_ptr<Exchange> exchange) override;
  Response render_refusal(const Refusal& refusal) override;

  // The n-th (0-based) held exchange (POST /slow, /stream), waiting up to 10 s; null if none came.
  std::shared_ptr<Exchange> wait_held(size_t n);
  // Whether at least `count` on_gone callbacks ran within `timeout_s`.
  bool wait_gone(int count, double timeout_s);
  int gone_count() const;
  int handled_count() const;
  std::vector<Refusal> refusals() const;
  // Answers every held exchange not answered yet (200 "released"; streams end).
  void release_all();
  // The threads check_head ran on (I/O threads), and those handle ran on (workers).
  std::pair<std::set<std::thread::id>, std::set<std::thread::id>> threads() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Exchange>> held_;  // guarded by mu_
  std::vector<Refusal> refusals_;                // guarded by mu_
  int gone_ = 0;                                 // guarded by mu_
  int handled_ = 0;                              // guarded by mu_
  std::set<std::thread::id> check_threads_;      // guarded by mu_
  std::set<std::thread::id> handle_threads_;     // guarded by mu_
};

}  // namespace flux2::server::http::testing
