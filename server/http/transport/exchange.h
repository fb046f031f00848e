// Exchange: one request in flight between the transport and the application. The application gets
// it in Application::handle and answers with respond() or begin_stream()/write()/end_stream(),
// from any thread, now or later; on_gone() tells it the client went away. Tested by
// tests/server/http_transport_test.cc (every route of its test application goes through one).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "server/http/transport/message.h"

namespace flux2::server::http {

// What an Exchange forwards its answer to: the connection it came from (connection.h). Each call
// queues the work on the connection's own I/O strand and returns at once.
class ExchangeSink {
 public:
  virtual ~ExchangeSink() = default;
  virtual void deliver_response(Response response) = 0;
  virtual void deliver_stream_begin(int status, HeaderFields headers,
                                    std::string keepalive_chunk) = 0;
  virtual void deliver_stream_data(std::string data) = 0;
  virtual void deliver_stream_end() = 0;
};

// Every method is thread-safe. Calls after the answer is complete, after the client is gone, or
// out of order (write() before begin_stream(), a second respond()) are ignored.
class Exchange {
 public:
  Exchange(Request request, std::weak_ptr<ExchangeSink> sink);
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const Request& request() const { return request_; }

  // The whole response, once.
  void respond(Response response);
  // A streamed response: the head now, then write()s in order, then end_stream(). HTTP/1.1:
  // chunked; HTTP/1.0: close-delimited. `keepalive_chunk` (e.g. ":\n\n" for server-sent events)
  // is what the transport writes as a probe while the client has half-closed (transport.h);
  // empty: a half-close of a streamed response counts as gone.
  void begin_stream(int status, HeaderFields headers, std::string keepalive_chunk);
  void write(std::string data);  // empty data is ignored (it would end a chunked body)
  void end_stream();

  // `callback` runs at most once, on an I/O thread, when the client reset or fully closed the
  // connection, or a write failed or timed out (TransportOptions::write_timeout_s); not for a
  // half-close. Registered after that happened, it runs at once on the caller's thread. Keep it
  // short (it runs on an I/O thread); it must not call back into this Exchange under a lock the
  // application also holds while calling respond().
  void on_gone(std::function<void()> callback);
  bool gone() const;

  // For the connection (its strand): the exchange is over. `gone`: the client went away before the
  // answer was written (runs the on_gone callback). Later answers are dropped.
  void detach(bool gone);

 private:
  enum class Answer {
    kNone,       // nothing sent yet
    kStreaming,  // begin_stream() called, end_stream() not yet
    kComplete,   // respond() or end_stream() called
  };

  const Request request_;
  mutable std::mutex mu_;
  std::weak_ptr<ExchangeSink> sink_;  // guarded by mu_; reset by detach()
  Answer answer_ = Answer::kNone;     // guarded by mu_
  bool gone_ = false;                 // guarded by mu_
  std::function<void()> on_gone_;     // guarded by mu_
};

}  // namespace flux2::server::http
