// Connection: one client connection's whole life on its own strand: TLS handshake, then requests
// one at a time (parse the head with Beast's parser, check it, read the body, hand it to the
// application, write the answer, keep the bytes after it for the next one), with the idle, head,
// body, write and linger timers, half-close probing and the close. Internal to
// flux2_http_transport; behaviour documented in transport.h and README.md; tested by
// tests/server/http_transport_test.cc.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>

#include "server/http/transport/byte_stream.h"
#include "server/http/transport/connection_registry.h"
#include "server/http/transport/exchange.h"
#include "server/http/transport/head_checks.h"
#include "server/http/transport/transport_context.h"

namespace flux2::server::http {

// A request body that grows as its bytes arrive. Beast's string_body reserves the whole
// Content-Length up front, which would let a client that declares 48 MiB and sends nothing hold
// 48 MiB per connection.
struct GrowingStringBody {
  using value_type = std::string;
  class reader {
   public:
    template <bool kIsRequest, class Fields>
    reader(boost::beast::http::header<kIsRequest, Fields>&, value_type& body) : body_(body) {}
    void init(const boost::optional<std::uint64_t>&, boost::system::error_code& ec) { ec = {}; }
    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::system::error_code& ec);
    void finish(boost::system::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

class Connection final : public RegisteredConnection,
                         public ExchangeSink,
                         public std::enable_shared_from_this<Connection> {
 public:
  Connection(TransportContext& context, std::unique_ptr<ByteStream> stream, std::string peer);

  // Serves requests (after the TLS handshake). The connection is in the registry.
  void start();
  // A connection the registry refused: after the TLS handshake, the rendered 503, then close.
  void start_refused(Refusal refusal);
  uint64_t id() const { return id_; }

  // RegisteredConnection (any thread; queued on the strand).
  void evict() override;
  void begin_drain() override;
  void force_close() override;
  void abandon() override;

  // ExchangeSink (any thread; queued on the strand).
  void deliver_response(Response response) override;
  void deliver_stream_begin(int status, HeaderFields headers, std::string keepalive) override;
  void deliver_stream_data(std::string data) override;
  void deliver_stream_end() override;

 private:
  // Where the connection is in its life; every timer expiry and I/O completion checks it.
  enum class Phase {
    kHandshake,  // TLS handshake (head_timeout_s); plaintext passes through at once
    kIdle,       // waiting for a request's first byte, nothing buffered (idle_timeout_s; evictable)
    kHead,       // reading the request line and fields (head_timeout_s from the first byte)
    kBody,       // reading the body (body_timeout_s)
    kHandling,   // the exchange is with the application, or its answer is being written
    kClosing,    // writing a final response (a refusal): then linger
    kLinger,     // our side shut down; discarding input until EOF (kLingerTimeout), then close
    kClosed,
  };
  // What of the exchange's answer has been queued.
  enum class Output {
    kNone,       // nothing (half-close probes are 102 Processing)
    kStreaming,  // the head of a streamed response (probes are the keep-alive chunk)
    kComplete,   // everything: the exchange ends once it is written
  };
  using Clock = std::chrono::steady_clock;
  using RequestParser = boost::beast::http::request_parser<GrowingStringBody>;

  // Reading and parsing.
  void read_more();
  void on_read(const boost::system::error_code& error, std::size_t bytes);
  void on_peer_eof();
  void next_request();
  void begin_head();
  void parse_head();
  void on_head(std::size_t head_bytes);
  void parse_body();
  void dispatch();
  // Answering.
  void on_response(Response response);
  void on_stream_begin(int status, HeaderFields headers, std::string keepalive);
  void on_stream_data(std::string data);
  void on_stream_end();
  void finish_exchange();
  void refuse(const HeadProblem& problem);
  void send_final(Response response);
  // Half-close: probe the peer while the exchange is unanswered.
  void on_half_close();
  void probe();
  // Writing.
  void send(std::string bytes);
  void write_next();
  void on_write(const boost::system::error_code& error, std::size_t bytes);
  void on_written();
  // Timers and the end.
  void arm(boost::asio::steady_timer& timer, uint64_t& serial, Clock::duration after,
           void (Connection::*then)());
  void disarm(boost::asio::steady_timer& timer, uint64_t& serial);
  void on_phase_timeout();
  void begin_linger();
  void close();
  template <class Work>
  void on_strand(Work work);

  // Bytes of a read; copied into buffer_ at once, so a read can stay pending while buffer_ is
  // consumed (flat_buffer may move its bytes).
  static constexpr std::size_t kReadChunk = 16 << 10;

  TransportContext& context_;
  const std::unique_ptr<ByteStream> stream_;
  const boost::asio::any_io_executor executor_;  // the strand every handler runs on
  const std::string peer_;                       // "address:port"
  const uint64_t id_;
  const std::size_t buffer_cap_;  // the head limit + one read: buffer_ never holds more
  Phase phase_ = Phase::kHandshake;
  bool registered_ = false;  // in context_.registry (a refused connection is not)

  boost::asio::steady_timer phase_timer_;  // handshake, idle, head, body, linger
  boost::asio::steady_timer write_timer_;  // write progress
  boost::asio::steady_timer probe_timer_;  // half-close probes
  uint64_t phase_serial_ = 0, write_serial_ = 0, probe_serial_ = 0;  // stale expiries are ignored

  boost::beast::flat_buffer buffer_;  // bytes received, not yet parsed (pipelined requests too)
  std::array<char, kReadChunk> scratch_;
  bool reading_ = false;
  bool peer_eof_ = false;  // the peer closed (or half-closed) its side
  std::optional<RequestParser> parser_;
  bool line_checked_ = false;  // the request line's length is known
  int64_t line_bytes_ = 0;
  std::size_t head_consumed_ = 0;  // head bytes the parser took so far (several puts)
  RequestHead head_;

  std::shared_ptr<Exchange> exchange_;  // the request in flight, if any
  int version_ = 11;
  bool keep_alive_ = false;    // another request may follow the response
  bool head_request_ = false;  // HEAD: the response's body is not sent
  Output output_ = Output::kNone;
  bool chunked_ = false;  // the streamed response is chunked (else close-delimited)
  std::string keepalive_chunk_;
  Clock::duration probe_delay_{};

  std::deque<std::string> out_;   // queued output, written in order
  std::size_t out_offset_ = 0;    // bytes of out_.front() already written
  std::size_t queued_bytes_ = 0;  // bytes in out_ not yet written
  bool writing_ = false;
};

template <class ConstBufferSequence>
std::size_t GrowingStringBody::reader::put(const ConstBufferSequence& buffers,
                                           boost::system::error_code& ec) {
  std::size_t total = 0;
  for (auto it = boost::asio::buffer_sequence_begin(buffers);
       it != boost::asio::buffer_sequence_end(buffers); ++it) {
    const boost::asio::const_buffer buffer = *it;
    body_.append(static_cast<const char*>(buffer.data()), buffer.size());
    total += buffer.size();
  }
  ec = {};
  return total;
}

}  // namespace flux2::server::http
