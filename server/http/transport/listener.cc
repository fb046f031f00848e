// The accept loop and connection admission; see listener.h.
// Tested by tests/server/http_transport_test.cc.
#include "server/http/transport/listener.h"

#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include "server/http/transport/byte_stream.h"
#include "server/http/transport/connection.h"

namespace flux2::server::http {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

// After an accept error such as EMFILE, wait this long before accepting again (no busy loop).
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(50);

// "address:port", IPv6 addresses in brackets.
std::string peer_text(const tcp::endpoint& endpoint) {
  const std::string address = endpoint.address().to_string();
  const std::string port = std::to_string(endpoint.port());
  return endpoint.address().is_v6() ? "[" + address + "]:" + port : address + ":" + port;
}

}  // namespace

Listener::Listener(TransportContext& context)
    : context_(context),
      acceptor_(asio::make_strand(context.io)),
      retry_timer_(acceptor_.get_executor()) {}

absl::Status Listener::open(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  error_code error;
  asio::ip::address address = asio::ip::make_address(host, error);
  if (error) {
    tcp::resolver resolver(context_.io);
    const tcp::resolver::results_type found = resolver.resolve(host, "", error);
    if (error || found.empty()) {
      return absl::UnavailableError("cannot listen on " + where + ": cannot resolve " + host);
    }
    address = found.begin()->endpoint().address();
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  // Only SO_REUSEADDR (a restart binds over TIME_WAIT); never SO_REUSEPORT, which would let a
  // second server share the port silently instead of failing here.
  acceptor_.open(endpoint.protocol(), error);
  if (!error) acceptor_.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) acceptor_.bind(endpoint, error);
  if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
  if (!error) {
    port_ = acceptor_.local_endpoint(error).port();
    return absl::OkStatus();
  }
  const std::string reason = error.message();
  acceptor_.close(error);
  return absl::UnavailableError("cannot listen on " + where + ": " + reason);
}

void Listener::start() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] { self->accept_next(); });
}

void Listener::close() {
  asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
    error_code ignored;
    self->acceptor_.close(ignored);
    self->retry_timer_.cancel();
  });
}

void Listener::accept_next() {
  if (!acceptor_.is_open()) return;
  // Each connection gets a strand of its own: its handlers never run concurrently.
  acceptor_.async_accept(asio::make_strand(context_.io),
                         [self = shared_from_this()](const error_code& error, tcp::socket socket) {
                           self->on_accept(error, std::move(socket));
                         });
}

void Listener::on_accept(const error_code& error, tcp::socket socket) {
  if (!acceptor_.is_open() || error == asio::error::operation_aborted) return;
  if (error) {
    retry_timer_.expires_after(kAcceptRetryDelay);
    retry_timer_.async_wait([self = shared_from_this()](const error_code& wait_error) {
      if (!wait_error) self->accept_next();
    });
    return;
  }
  admit(std::move(socket));
  accept_next();
}

void Listener::admit(tcp::socket socket) {
  error_code error;
  const tcp::endpoint peer = socket.remote_endpoint(error);
  if (error) return;  // already gone
  socket.set_option(tcp::no_delay(true), error);
  std::unique_ptr<ByteStream> stream = context_.tls
                                           ? make_tls_stream(std::move(socket), *context_.tls)
                                           : make_plain_stream(std::move(socket));
  auto connection = std::make_shared<Connection>(context_, std::move(stream), peer_text(peer));
  const TransportOptions& options = context_.options;
  switch (context_.registry.admit(connection->id(), peer.address().to_string(), connection)) {
    case ConnectionRegistry::Verdict::kAdmitted:
      return connection->start();
    case ConnectionRegistry::Verdict::kTooManyConnections:
      return connection->start_refused(
          {503,
           "the server has " + std::to_string(options.max_connections) +
               " connections open (max_connections), none of them idle",
           {},
           {},
           peer_text(peer)});
    case ConnectionRegistry::Verdict::kTooManyFromClient:
      return connection->start_refused(
          {503,
           "this client has " + std::to_string(options.max_connections_per_client) +
               " connections open (max_connections_per_client), none of them idle",
           {},
           {},
           peer_text(peer)});
  }
}

}  // namespace flux2::server::http
