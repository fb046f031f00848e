// The transport tests' application; see http_test_app.h.
// Used by tests/server/http_transport_test.cc.
#include "tests/server/http_test_app.h"

#include <chrono>
#include <string>

namespace flux2::server::http::testing {

std::optional<Response> TestApplication::check_head(const RequestHead& head) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_threads_.insert(std::this_thread::get_id());
  }
  if (head.path == "/refuse") return Response{401, {{"WWW-Authenticate", "Bearer"}}, "refused"};
  if (head.path == "/health" || head.path == "/echo" || head.path == "/slow" ||
      head.path == "/stream" || head.path == "/big") {
    return std::nullopt;
  }
  return Response{404, {{"Content-Type", "text/plain"}}, "no route for " + head.path};
}

void TestApplication::handle(std::shared_ptr<Exchange> exchange) {
  const Request& request = exchange->request();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++handled_;
    handle_threads_.insert(std::this_thread::get_id());
  }
  if (request.path == "/health") {
    return exchange->respond({200, {{"Content-Type", "text/plain"}}, "ok"});
  }
  if (request.path == "/echo") {
    return exchange->respond(
        {200, {}, std::to_string(request.body.size()) + ":" + request.body.substr(0, 16)});
  }
  exchange->on_gone([this] {
    std::lock_guard<std::mutex> lock(mu_);
    ++gone_;
    cv_.notify_all();
  });
  if (request.path == "/big") {
    return exchange->respond({200, {}, std::string(size_t{64} << 20, 'x')});
  }
  if (request.path == "/stream") {
    exchange->begin_stream(200, {{"Content-Type", "text/event-stream"}}, ":\n\n");
  }
  std::lock_guard<std::mutex> lock(mu_);
  held_.push_back(std::move(exchange));
  cv_.notify_all();
}

Response TestApplication::render_refusal(const Refusal& refusal) {
  std::lock_guard<std::mutex> lock(mu_);
  refusals_.push_back(refusal);
  return {refusal.status, {{"Content-Type", "text/plain"}}, refusal.message};
}

std::shared_ptr<Exchange> TestApplication::wait_held(size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_.size() > n; });
  return held_.size() > n ? held_[n] : nullptr;
}

bool TestApplication::wait_gone(int count, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return gone_ >= count; });
}

int TestApplication::gone_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

int TestApplication::handled_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handled_;
}

std::vector<Refusal> TestApplication::refusals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusals_;
}

std::pair<std::set<std::thread::id>, std::set<std::thread::id>> TestApplication::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {check_threads_, handle_threads_};
}

void TestApplication::release_all() {
  std::vector<std::shared_ptr<Exchange>> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = held_;
  }
  for (const std::shared_ptr<Exchange>& exchange : held) {
    exchange->respond({200, {}, "released"});  // ignored when already answered or streaming
    exchange->end_stream();                    // ignored unless streaming
  }
}

}  // namespace flux2::server::http::testing
