// One request in flight; see exchange.h.
// Tested by tests/server/http_transport_test.cc.
#include "server/http/transport/exchange.h"

#include <utility>

namespace flux2::server::http {

Exchange::Exchange(Request request, std::weak_ptr<ExchangeSink> sink)
    : request_(std::move(request)), sink_(std::move(sink)) {}

// Each answer locks mu_ while handing the work to the sink, so detach() (which takes mu_) cannot
// slip between the check and the hand-off: after detach() returns, nothing reaches the connection.
void Exchange::respond(Response response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_ != Answer::kNone) return;
  answer_ = Answer::kComplete;
  if (std::shared_ptr<ExchangeSink> sink = sink_.lock()) {
    sink->deliver_response(std::move(response));
  }
}

void Exchange::begin_stream(int status, HeaderFields headers, std::string keepalive_chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_ != Answer::kNone) return;
  answer_ = Answer::kStreaming;
  if (std::shared_ptr<ExchangeSink> sink = sink_.lock()) {
    sink->deliver_stream_begin(status, std::move(headers), std::move(keepalive_chunk));
  }
}

void Exchange::write(std::string data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_ != Answer::kStreaming || data.empty()) return;
  if (std::shared_ptr<ExchangeSink> sink = sink_.lock()) {
    sink->deliver_stream_data(std::move(data));
  }
}

void Exchange::end_stream() {
  std::lock_guard<std::mutex> lock(mu_);
  if (answer_ != Answer::kStreaming) return;
  answer_ = Answer::kComplete;
  if (std::shared_ptr<ExchangeSink> sink = sink_.lock()) sink->deliver_stream_end();
}

void Exchange::on_gone(std::function<void()> callback) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!gone_) {
    on_gone_ = std::move(callback);
    return;
  }
  lock.unlock();
  if (callback) callback();
}

bool Exchange::gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

void Exchange::detach(bool gone) {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sink_.reset();
    if (!gone || gone_) return;
    gone_ = true;
    callback = std::move(on_gone_);
  }
  if (callback) callback();
}

}  // namespace flux2::server::http
