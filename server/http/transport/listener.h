// Listener: the listening socket and its accept loop. Each accepted connection is admitted by the
// registry (evicting an idle one when a limit is reached) and served, or answered 503 and closed.
// Internal to flux2_http_transport; tested by tests/server/http_transport_test.cc
// (HttpTransport.*Limit*, *Evict*, BindFailure*).
#pragma once

#include <memory>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "absl/status/status.h"
#include "server/http/transport/transport_context.h"

namespace flux2::server::http {

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  explicit Listener(TransportContext& context);

  // Binds and listens (SO_REUSEADDR only). Unavailable naming host:port when it cannot.
  absl::Status open(const std::string& host, int port);
  int port() const { return port_; }
  // Starts accepting on the I/O threads.
  void start();
  // Stops accepting (queued on the acceptor's strand; idempotent).
  void close();

 private:
  void accept_next();
  void on_accept(const boost::system::error_code& error, boost::asio::ip::tcp::socket socket);
  void admit(boost::asio::ip::tcp::socket socket);

  TransportContext& context_;
  boost::asio::ip::tcp::acceptor acceptor_;  // on a strand of its own
  boost::asio::steady_timer retry_timer_;    // after an accept error (EMFILE): wait, then retry
  int port_ = 0;
};

}  // namespace flux2::server::http
