// The HTTP/1.1 transport (Boost.Beast's parser over Boost.Asio sockets, plaintext or TLS): it owns
// the connection loop, the buffers and the sockets, enforces every limit and timeout of
// TransportOptions, and hands whole requests to an Application on worker threads. Behaviour
// (status codes, pipelining, half-close probing, eviction, drain) is described below and in
// server/http/transport/README.md. Tested by tests/server/http_transport_test.cc over loopback:
//   cmake --build build-http --target http_transport_tests && build-http/bin/http_transport_tests
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "server/http/transport/exchange.h"
#include "server/http/transport/message.h"
#include "server/http/transport/options.h"

namespace flux2::server::http {

class Application {
 public:
  virtual ~Application() = default;
  // After the head passed the transport's checks, before any body byte is read: routing
  // (404/405), auth (401), draining (503). A Response refuses the request: its body is never read,
  // the response carries Connection: close and the connection closes after it. nullopt: the body
  // is read and handle() called. Runs on an I/O thread: it must not block.
  virtual std::optional<Response> check_head(const RequestHead& head) = 0;
  // The whole request, on a worker thread; must eventually respond() or begin_stream() +
  // end_stream() (possibly later, from any thread). It should return promptly: stop() joins the
  // workers.
  virtual void handle(std::shared_ptr<Exchange> exchange) = 0;
  // Renders (and counts) a refusal of the transport's own (400, 408, 413, 414, 415, 431, 501,
  // 503). Runs on an I/O thread. The transport adds Connection: close (it always closes after a
  // refusal) and, for 503, Retry-After: 1 unless the response has one.
  virtual Response render_refusal(const Refusal& refusal) = 0;
};

struct TransportContext;  // transport_context.h: what the I/O threads share

class Transport {
 public:
  explicit Transport(Application& app);
  ~Transport();  // stop(now)
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds host:port (SO_REUSEADDR only, never SO_REUSEPORT) and starts the I/O and worker threads.
  // Unavailable naming the address when it cannot bind; InvalidArgument for bad options or TLS
  // PEM. Call once.
  absl::Status start(const TransportOptions& options);
  int port() const { return port_; }

  // Stops accepting; closes idle keep-alive connections now; every later response carries
  // Connection: close; requests already read are answered normally. Idempotent.
  void drain();
  // drain(), then waits until every admitted exchange (a request handed to handle()) has been
  // answered and its response written, or gone, or `deadline`; then closes every connection (an
  // exchange still unanswered is gone: on_gone runs) and joins the threads; handle() calls still
  // queued run (their exchanges gone). Idempotent; the destructor calls it.
  void stop(std::chrono::steady_clock::time_point deadline);

 private:
  Application& app_;
  std::mutex mu_;  // start/drain/stop against each other
  std::unique_ptr<TransportContext> context_;
  bool stopped_ = false;
  int port_ = 0;
};

}  // namespace flux2::server::http
