// Plain and TLS byte streams; see byte_stream.h.
// Tested through tests/server/http_transport_test.cc.
#include "server/http/transport/byte_stream.h"

#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>

namespace flux2::server::http {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class PlainStream final : public ByteStream {
 public:
  explicit PlainStream(tcp::socket socket) : socket_(std::move(socket)) {}

  void async_handshake(DoneHandler done) override {
    asio::post(socket_.get_executor(), [done = std::move(done)] { done({}); });
  }
  void async_read_some(asio::mutable_buffer buffer, IoHandler done) override {
    socket_.async_read_some(buffer, std::move(done));
  }
  void async_write_some(asio::const_buffer buffer, IoHandler done) override {
    socket_.async_write_some(buffer, std::move(done));
  }
  tcp::socket& socket() override { return socket_; }

 private:
  tcp::socket socket_;
};

class TlsStream final : public ByteStream {
 public:
  TlsStream(tcp::socket socket, asio::ssl::context& context)
      : stream_(std::move(socket), context) {}

  void async_handshake(DoneHandler done) override {
    stream_.async_handshake(asio::ssl::stream_base::server, std::move(done));
  }
  void async_read_some(asio::mutable_buffer buffer, IoHandler done) override {
    stream_.async_read_some(buffer, std::move(done));
  }
  void async_write_some(asio::const_buffer buffer, IoHandler done) override {
    stream_.async_write_some(buffer, std::move(done));
  }
  tcp::socket& socket() override { return stream_.next_layer(); }

 private:
  asio::ssl::stream<tcp::socket> stream_;
};

}  // namespace

std::unique_ptr<ByteStream> make_plain_stream(tcp::socket socket) {
  return std::make_unique<PlainStream>(std::move(socket));
}

std::unique_ptr<ByteStream> make_tls_stream(tcp::socket socket, asio::ssl::context& context) {
  return std::make_unique<TlsStream>(std::move(socket), context);
}

}  // namespace flux2::server::http
