// The byte stream under a connection: plain TCP or TLS over TCP behind one small interface, so the
// connection's state machine (connection.h) is written once. Calls come from the connection's
// strand (the socket's executor); one read and one write may be in flight at a time. Tested
// through tests/server/http_transport_test.cc (plaintext everywhere, TLS in HttpTransportTls*).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

namespace flux2::server::http {

class ByteStream {
 public:
  using IoHandler = std::function<void(const boost::system::error_code&, std::size_t)>;
  using DoneHandler = std::function<void(const boost::system::error_code&)>;

  virtual ~ByteStream() = default;

  // TLS: the server side of the handshake. Plaintext: completes at once (posted, never inline).
  virtual void async_handshake(DoneHandler done) = 0;
  // Like the socket's: at least one byte, or an error (eof when the peer closed its side; TLS
  // reports a peer that closed without close_notify as ssl::error::stream_truncated).
  virtual void async_read_some(boost::asio::mutable_buffer buffer, IoHandler done) = 0;
  virtual void async_write_some(boost::asio::const_buffer buffer, IoHandler done) = 0;
  // The TCP socket underneath: shutdown, close, addresses.
  virtual boost::asio::ip::tcp::socket& socket() = 0;
};

std::unique_ptr<ByteStream> make_plain_stream(boost::asio::ip::tcp::socket socket);
// `context` must outlive the stream (the Transport owns it).
std::unique_ptr<ByteStream> make_tls_stream(boost::asio::ip::tcp::socket socket,
                                            boost::asio::ssl::context& context);

}  // namespace flux2::server::http
