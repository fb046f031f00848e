// One client connection's state machine; see connection.h (phases) and transport.h (behaviour).
// Tested by tests/server/http_transport_test.cc.
#include "server/http/transport/connection.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/http/error.hpp>

#include "server/http/transport/transport.h"

namespace flux2::server::http {
namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using boost::system::error_code;

// After a final response, input is discarded for at most this long before the socket closes, so
// the response is not lost to the RST that closing on unread input sends.
constexpr auto kLingerTimeout = std::chrono::seconds(2);
// Half-close probes: at once, then after 100 ms, 200 ms, ... at most 2 s apart. A fully closed
// peer answers the first probe with RST, so the second one fails: gone within about 100-300 ms.
constexpr auto kFirstProbeDelay = std::chrono::milliseconds(100);
constexpr auto kMaxProbeDelay = std::chrono::seconds(2);
constexpr std::string_view kProcessing = "HTTP/1.1 102 Processing\r\n\r\n";
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
// The longest field value Beast's parser stores (16-bit lengths, less 2).
constexpr int kMaxFieldBytes = 65532;
// A streamed response whose client reads slower than the application writes is cut off (gone)
// once this much is queued: the write timeout only ends a client that stopped reading entirely.
constexpr std::size_t kMaxQueuedStreamBytes = std::size_t{64} << 20;
// Bytes of the CRLFs after the request line and after the last field.
constexpr int64_t kHeadCrlfBytes = 4;

bool is_eof(const error_code& error) {
  return error == asio::error::eof || error == asio::ssl::error::stream_truncated;
}

std::chrono::steady_clock::duration seconds(double value) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(value));
}

// "10 s", "0.3 s": a timeout for a message.
std::string seconds_text(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", value);
  return text;
}

std::string_view view_of(const boost::beast::flat_buffer& buffer) {
  return {static_cast<const char*>(buffer.data().data()), buffer.data().size()};
}

bool expects_continue(const RequestHead& head) {
  const std::optional<std::string_view> expect = head.value("Expect");
  return expect && ascii_iequals(trim_ows(*expect), "100-continue");
}

bool has_field(const HeaderFields& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& field) { return ascii_iequals(field.first, name); });
}

}  // namespace

Connection::Connection(TransportContext& context, std::unique_ptr<ByteStream> stream,
                       std::string peer)
    : context_(context),
      stream_(std::move(stream)),
      executor_(stream_->socket().get_executor()),
      peer_(std::move(peer)),
      id_(context.next_connection_id++),
      buffer_cap_(static_cast<std::size_t>(context.options.max_request_line_bytes +
                                           context.options.max_header_bytes + kHeadCrlfBytes) +
                  kReadChunk),
      phase_timer_(executor_),
      write_timer_(executor_),
      probe_timer_(executor_) {}

template <class Work>
void Connection::on_strand(Work work) {
  asio::post(executor_,
             [self = shared_from_this(), work = std::move(work)]() mutable { work(*self); });
}

// ---------------------------------------------------------------------------------------------
// Start, registry calls and the end.

void Connection::start() {
  registered_ = true;
  on_strand([](Connection& self) {
    self.arm(self.phase_timer_, self.phase_serial_, seconds(self.context_.options.head_timeout_s),
             &Connection::on_phase_timeout);
    self.stream_->async_handshake([self = self.shared_from_this()](const error_code& error) {
      if (self->phase_ != Phase::kHandshake) return;
      if (error) return self->close();
      self->next_request();
    });
  });
}

void Connection::start_refused(Refusal refusal) {
  on_strand([refusal = std::move(refusal)](Connection& self) {
    self.arm(self.phase_timer_, self.phase_serial_, seconds(self.context_.options.head_timeout_s),
             &Connection::on_phase_timeout);
    self.stream_->async_handshake(
        [self = self.shared_from_this(), refusal](const error_code& error) {
          if (self->phase_ != Phase::kHandshake) return;
          if (error) return self->close();
          Response response = self->context_.app.render_refusal(refusal);
          if (!has_field(response.headers, "Retry-After")) {
            response.headers.emplace_back("Retry-After", "1");
          }
          self->send_final(std::move(response));
        });
  });
}

void Connection::evict() {
  // The registry dropped this connection while it was idle. If a request's first bytes arrived
  // meanwhile, mark_busy() failed and the connection closed itself already.
  on_strand([](Connection& self) {
    if (self.phase_ == Phase::kIdle) self.close();
  });
}

void Connection::begin_drain() {
  on_strand([](Connection& self) {
    if (self.phase_ == Phase::kIdle || self.phase_ == Phase::kHandshake) self.close();
  });
}

void Connection::force_close() {
  on_strand([](Connection& self) { self.close(); });
}

void Connection::abandon() {
  if (!exchange_) return;
  exchange_->detach(/*gone=*/true);
  exchange_.reset();
  context_.exchange_finished();
}

void Connection::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  disarm(phase_timer_, phase_serial_);
  disarm(write_timer_, write_serial_);
  disarm(probe_timer_, probe_serial_);
  error_code ignored;
  stream_->socket().close(ignored);
  if (registered_) context_.registry.remove(id_);
  if (exchange_) {  // its answer can no longer reach the client
    exchange_->detach(/*gone=*/true);
    exchange_.reset();
    context_.exchange_finished();
  }
  out_.clear();
  queued_bytes_ = 0;
  buffer_.clear();
  parser_.reset();
}

void Connection::begin_linger() {
  phase_ = Phase::kLinger;
  if (peer_eof_) return close();
  error_code ignored;
  stream_->socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  arm(phase_timer_, phase_serial_, kLingerTimeout, &Connection::on_phase_timeout);
  read_more();
}

// ---------------------------------------------------------------------------------------------
// Timers.

void Connection::arm(asio::steady_timer& timer, uint64_t& serial, Clock::duration after,
                     void (Connection::*then)()) {
  const uint64_t mine = ++serial;
  timer.expires_after(after);
  timer.async_wait([self = shared_from_this(), &serial, mine, then](const error_code& error) {
    if (error || serial != mine || self->phase_ == Phase::kClosed) return;
    ((*self).*then)();
  });
}

void Connection::disarm(asio::steady_timer& timer, uint64_t& serial) {
  ++serial;
  timer.cancel();
}

void Connection::on_phase_timeout() {
  const TransportOptions& options = context_.options;
  switch (phase_) {
    case Phase::kHead:
      return refuse(
          {408, "the request head did not arrive within " + seconds_text(options.head_timeout_s)});
    case Phase::kBody:
      return refuse(
          {408, "the request body did not arrive within " + seconds_text(options.body_timeout_s)});
    case Phase::kHandshake:
    case Phase::kIdle:
    case Phase::kLinger:
      return close();
    default:
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Reading and parsing.

void Connection::read_more() {
  if (reading_ || peer_eof_ || phase_ == Phase::kClosed) return;
  std::size_t room = kReadChunk;
  if (phase_ != Phase::kClosing && phase_ != Phase::kLinger) {
    // Full (a client pipelining far ahead): read again once the connection consumed some.
    room = std::min(kReadChunk, buffer_cap_ - std::min(buffer_cap_, buffer_.size()));
    if (room == 0) return;
  }
  reading_ = true;
  stream_->async_read_some(asio::buffer(scratch_.data(), room),
                           [self = shared_from_this()](const error_code& error, std::size_t bytes) {
                             self->on_read(error, bytes);
                           });
}

void Connection::on_read(const error_code& error, std::size_t bytes) {
  reading_ = false;
  if (phase_ == Phase::kClosed) return;
  if (error) {
    if (is_eof(error)) return on_peer_eof();
    return close();  // reset or failed: an exchange in flight is gone
  }
  if (phase_ == Phase::kClosing || phase_ == Phase::kLinger) return read_more();  // discarded
  const asio::mutable_buffer space = buffer_.prepare(bytes);
  std::copy_n(scratch_.data(), bytes, static_cast<char*>(space.data()));
  buffer_.commit(bytes);
  switch (phase_) {
    case Phase::kIdle:
      if (!context_.registry.mark_busy(id_)) return close();  // evicted meanwhile
      return begin_head();
    case Phase::kHead:
      return parse_head();
    case Phase::kBody:
      return parse_body();
    default:
      return read_more();  // kHandling: pipelined bytes wait in buffer_; EOF/RST are noticed
  }
}

void Connection::on_peer_eof() {
  peer_eof_ = true;
  if (phase_ == Phase::kHandling) return on_half_close();
  if (phase_ == Phase::kClosing) return;  // the final response goes out, then close
  close();                                // idle, a partial request, lingering: nothing to answer
}

void Connection::next_request() {
  exchange_.reset();
  parser_.reset();
  output_ = Output::kNone;
  disarm(probe_timer_, probe_serial_);
  // RFC 9112 section 2.2: a server should ignore empty lines received before a request line.
  std::string_view bytes = view_of(buffer_);
  std::size_t blank = 0;
  while (blank < bytes.size() && (bytes[blank] == '\r' || bytes[blank] == '\n')) ++blank;
  buffer_.consume(blank);
  // A pipelined request already received is served, even while draining (with Connection: close).
  if (buffer_.size() > 0) return begin_head();
  if (peer_eof_ || context_.draining) return close();
  phase_ = Phase::kIdle;
  if (registered_) context_.registry.mark_idle(id_);
  arm(phase_timer_, phase_serial_, seconds(context_.options.idle_timeout_s),
      &Connection::on_phase_timeout);
  read_more();
}

void Connection::begin_head() {
  const TransportOptions& options = context_.options;
  phase_ = Phase::kHead;
  arm(phase_timer_, phase_serial_, seconds(options.head_timeout_s), &Connection::on_phase_timeout);
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(options.max_request_line_bytes +
                                                   options.max_header_bytes + kHeadCrlfBytes));
  parser_->body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
  line_checked_ = false;
  head_consumed_ = 0;
  head_request_ = false;
  parse_head();
}

void Connection::parse_head() {
  if (!line_checked_) {
    const std::string_view bytes = view_of(buffer_);
    if (std::optional<HeadProblem> problem = check_request_line(bytes, context_.options)) {
      return refuse(*problem);
    }
    if (const std::optional<int64_t> length = request_line_length(bytes)) {
      line_checked_ = true;
      line_bytes_ = *length;
    }
  }
  // Beast's parser consumes the head as it parses it (the request line, then whole fields).
  error_code error;
  std::size_t used = 0;
  try {
    used = parser_->put(buffer_.data(), error);
  } catch (const std::length_error&) {
    // Beast's fields keep 16-bit lengths: it throws for a longer field value.
    return refuse(
        {431, "a header field is longer than " + std::to_string(kMaxFieldBytes) + " bytes"});
  }
  buffer_.consume(used);
  // Beast may take the head in several puts (the fields it could parse so far): count them all.
  head_consumed_ += used;
  if (error == bhttp::error::need_more) return peer_eof_ ? close() : read_more();
  if (error) return refuse(problem_of_parse_error(error, context_.options));
  on_head(head_consumed_);
}

void Connection::on_head(std::size_t head_bytes) {
  const auto& message = parser_->get();
  RequestHead head;
  head.method = std::string(message.method_string());
  head.target = std::string(message.target());
  head.path = head.target.substr(0, head.target.find('?'));
  head.version = static_cast<int>(message.version());
  for (const auto& field : message) {
    head.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  head.peer = peer_;
  HeadFacts facts;
  facts.request_line_bytes = line_bytes_;
  facts.field_bytes =
      std::max<int64_t>(0, static_cast<int64_t>(head_bytes) - line_bytes_ - kHeadCrlfBytes);
  facts.field_count = static_cast<int>(head.headers.size());
  facts.has_body = !parser_->is_done();
  head_request_ = head.method == "HEAD";
  if (std::optional<HeadProblem> problem = check_request_head(head, facts, context_.options)) {
    return refuse(*problem);
  }
  version_ = head.version;
  keep_alive_ = version_ == 11 && message.keep_alive();
  if (std::optional<Response> answer = context_.app.check_head(head)) {
    return send_final(std::move(*answer));
  }
  head_ = std::move(head);
  if (parser_->is_done()) return dispatch();
  phase_ = Phase::kBody;
  arm(phase_timer_, phase_serial_, seconds(context_.options.body_timeout_s),
      &Connection::on_phase_timeout);
  if (version_ == 11 && expects_continue(head_)) send(std::string(kContinue));
  parse_body();
}

void Connection::parse_body() {
  while (buffer_.size() > 0 && !parser_->is_done()) {
    error_code error;
    const std::size_t used = parser_->put(buffer_.data(), error);
    buffer_.consume(used);
    if (error == bhttp::error::need_more || (!error && used == 0)) break;
    if (error) return refuse(problem_of_parse_error(error, context_.options));
  }
  if (parser_->is_done()) return dispatch();
  if (peer_eof_) return close();
  read_more();
}

void Connection::dispatch() {
  disarm(phase_timer_, phase_serial_);
  phase_ = Phase::kHandling;
  Request request;
  static_cast<RequestHead&>(request) = std::move(head_);
  request.body = std::move(parser_->get().body());
  parser_.reset();
  output_ = Output::kNone;
  std::shared_ptr<ExchangeSink> sink = shared_from_this();
  exchange_ = std::make_shared<Exchange>(std::move(request), sink);
  context_.exchange_admitted();
  context_.workers.post(
      [&app = context_.app, exchange = exchange_] { app.handle(std::move(exchange)); });
  if (peer_eof_) return on_half_close();
  read_more();  // notices EOF and RST meanwhile, and keeps pipelined bytes
}

// ---------------------------------------------------------------------------------------------
// Answering.

void Connection::deliver_response(Response response) {
  on_strand([response = std::move(response)](Connection& self) mutable {
    self.on_response(std::move(response));
  });
}

void Connection::deliver_stream_begin(int status, HeaderFields headers, std::string keepalive) {
  on_strand([status, headers = std::move(headers),
             keepalive = std::move(keepalive)](Connection& self) mutable {
    self.on_stream_begin(status, std::move(headers), std::move(keepalive));
  });
}

void Connection::deliver_stream_data(std::string data) {
  on_strand(
      [data = std::move(data)](Connection& self) mutable { self.on_stream_data(std::move(data)); });
}

void Connection::deliver_stream_end() {
  on_strand([](Connection& self) { self.on_stream_end(); });
}

void Connection::on_response(Response response) {
  if (phase_ != Phase::kHandling || output_ != Output::kNone) return;
  output_ = Output::kComplete;
  disarm(probe_timer_, probe_serial_);
  if (response.status < 200 || response.status > 999) response = Response{500, {}, {}};
  keep_alive_ = keep_alive_ && !context_.draining && !asks_to_close(response.headers);
  const bool no_body = response.status == 204 || response.status == 304;
  send(render_response_head(response.status, response.headers,
                            no_body ? BodyFraming::kNoBody : BodyFraming::kContentLength,
                            static_cast<int64_t>(response.body.size()), !keep_alive_));
  if (!no_body && !head_request_) send(std::move(response.body));
}

void Connection::on_stream_begin(int status, HeaderFields headers, std::string keepalive) {
  if (phase_ != Phase::kHandling || output_ != Output::kNone) return;
  output_ = Output::kStreaming;
  if (status < 200 || status > 999) status = 500;
  keepalive_chunk_ = std::move(keepalive);
  chunked_ = version_ == 11;
  keep_alive_ = keep_alive_ && chunked_ && !context_.draining && !asks_to_close(headers);
  send(render_response_head(status, headers,
                            chunked_ ? BodyFraming::kChunked : BodyFraming::kCloseDelimited, 0,
                            !keep_alive_));
}

void Connection::on_stream_data(std::string data) {
  if (phase_ != Phase::kHandling || output_ != Output::kStreaming || head_request_) return;
  if (queued_bytes_ + data.size() > kMaxQueuedStreamBytes) return close();
  send(chunked_ ? render_chunk(data) : std::move(data));
}

void Connection::on_stream_end() {
  if (phase_ != Phase::kHandling || output_ != Output::kStreaming) return;
  output_ = Output::kComplete;
  disarm(probe_timer_, probe_serial_);
  if (chunked_ && !head_request_) send(std::string(kLastChunk));
  if (!writing_) on_written();
}

void Connection::finish_exchange() {
  exchange_->detach(/*gone=*/false);
  exchange_.reset();
  context_.exchange_finished();
  if (!keep_alive_) return begin_linger();
  next_request();
}

void Connection::refuse(const HeadProblem& problem) {
  Refusal refusal{problem.status, problem.message, {}, {}, peer_};
  if (parser_) {
    refusal.method = std::string(parser_->get().method_string());
    const std::string_view target = parser_->get().target();
    refusal.path = std::string(target.substr(0, target.find('?')));
  }
  send_final(context_.app.render_refusal(refusal));
}

void Connection::send_final(Response response) {
  phase_ = Phase::kClosing;
  disarm(phase_timer_, phase_serial_);  // the write timer bounds the rest
  buffer_.clear();
  parser_.reset();
  const bool no_body = response.status == 204 || response.status == 304;
  send(render_response_head(response.status, response.headers,
                            no_body ? BodyFraming::kNoBody : BodyFraming::kContentLength,
                            static_cast<int64_t>(response.body.size()), /*close=*/true));
  if (!no_body && !head_request_) send(std::move(response.body));
}

// ---------------------------------------------------------------------------------------------
// Half-close probing.

void Connection::on_half_close() {
  if (output_ == Output::kComplete) return;  // being written; the connection closes after it
  if (version_ == 10) return close();        // HTTP/1.0 clients do not half-close: gone
  probe_delay_ = Clock::duration::zero();
  probe();
}

void Connection::probe() {
  if (phase_ != Phase::kHandling || output_ == Output::kComplete) return;
  if (output_ == Output::kStreaming && (!chunked_ || keepalive_chunk_.empty())) return close();
  // A write in progress is a probe of its own: it fails when the peer is gone.
  if (!writing_) {
    send(output_ == Output::kStreaming ? render_chunk(keepalive_chunk_) : std::string(kProcessing));
  }
  probe_delay_ = probe_delay_ == Clock::duration::zero()
                     ? Clock::duration(kFirstProbeDelay)
                     : std::min<Clock::duration>(2 * probe_delay_, kMaxProbeDelay);
  arm(probe_timer_, probe_serial_, probe_delay_, &Connection::probe);
}

// ---------------------------------------------------------------------------------------------
// Writing.

void Connection::send(std::string bytes) {
  if (bytes.empty() || phase_ == Phase::kClosed) return;
  queued_bytes_ += bytes.size();
  out_.push_back(std::move(bytes));
  if (!writing_) write_next();
}

void Connection::write_next() {
  if (out_.empty()) {
    writing_ = false;
    disarm(write_timer_, write_serial_);
    return on_written();
  }
  writing_ = true;
  // Re-armed at every partial write: the timeout is for a write that makes no progress.
  arm(write_timer_, write_serial_, seconds(context_.options.write_timeout_s), &Connection::close);
  const std::string& front = out_.front();
  stream_->async_write_some(
      asio::buffer(front.data() + out_offset_, front.size() - out_offset_),
      [self = shared_from_this()](const error_code& error, std::size_t bytes) {
        self->on_write(error, bytes);
      });
}

void Connection::on_write(const error_code& error, std::size_t bytes) {
  if (phase_ == Phase::kClosed) return;
  if (error) return close();  // EPIPE, ECONNRESET: the client is gone
  out_offset_ += bytes;
  queued_bytes_ -= bytes;
  if (out_offset_ == out_.front().size()) {
    out_.pop_front();
    out_offset_ = 0;
  }
  write_next();
}

void Connection::on_written() {
  if (phase_ == Phase::kClosing) return begin_linger();
  if (phase_ == Phase::kHandling && output_ == Output::kComplete) return finish_exchange();
  // Otherwise a 100 Continue or a probe went out, or a part of a stream.
}

}  // namespace flux2::server::http
