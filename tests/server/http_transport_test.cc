// The HTTP/1.1 transport (server/http/transport/transport.h) over loopback with raw sockets,
// against a test application (http_test_app.h): keep-alive, every limit and its status (414, 431,
// 413 at the head and mid-chunked, 400 for each framing error with the socket closed at once, 501,
// 415), Range ignored, 100-continue, pipelining in order, half-close (the response arrives, on_gone
// is not called) against full close and RST (on_gone), streams (chunked; HTTP/1.0 close-delimited),
// drain and stop, idle eviction and 503 per client and in all, slowloris, the timeouts, TLS.
//   build-http/bin/http_transport_tests --gtest_filter='HttpTransport*'
#include "server/http/transport/transport.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <openssl/ssl.h>

#include "gtest/gtest.h"
#include "tests/server/http_raw_client.h"
#include "tests/server/http_test_app.h"

namespace flux2::server::http {
namespace {

using testing::now_s;
using testing::RawClient;
using testing::RawResponse;
using testing::TestApplication;

std::string get(std::string_view path, std::string_view fields = "") {
  return "GET " + std::string(path) + " HTTP/1.1\r\nHost: t\r\n" + std::string(fields) + "\r\n";
}

std::string post(std::string_view path, std::string_view body, std::string_view fields = "") {
  return "POST " + std::string(path) +
         " HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         std::string(fields) + "\r\n" + std::string(body);
}

std::string chunked_post(std::string_view path, std::string_view chunks) {
  return "POST " + std::string(path) +
         " HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(chunks);
}

class HttpTransportTest : public ::testing::Test {
 protected:
  void start(TransportOptions options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    transport_ = std::make_unique<Transport>(app_);
    const absl::Status status = transport_->start(options);
    ASSERT_TRUE(status.ok()) << status;
    port_ = transport_->port();
  }
  void TearDown() override {
    app_.release_all();
    if (transport_) transport_->stop(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  }
  // Sends `request` on a new connection and returns the response (status 0 when none came).
  RawResponse exchange(const std::string& request) {
    RawClient client(port_);
    client.send(request);
    return client.read_response().value_or(RawResponse{});
  }
  // The refused request's response, and that the server closed the connection at once after it.
  void expect_refused(const std::string& request, int status, std::string_view message_part) {
    SCOPED_TRACE(request.substr(0, 120));
    RawClient client(port_);
    client.send(request);
    const std::optional<RawResponse> response = client.read_response(5);
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->status, status) << response->body;
    EXPECT_EQ(response->header("Connection"), "close");
    EXPECT_NE(response->body.find(message_part), std::string::npos) << response->body;
    EXPECT_TRUE(client.wait_closed(1.0)) << "no keep-alive wait after a refusal";
  }

  TestApplication app_;  // outlives the transport (its on_gone callbacks)
  std::unique_ptr<Transport> transport_;
  int port_ = 0;
};

TEST_F(HttpTransportTest, KeepAliveServesRequestsInTurnOnOneConnection) {
  start();
  RawClient client(port_);
  for (int i = 0; i < 3; ++i) {
    client.send(get("/health"));
    const std::optional<RawResponse> response = client.read_response();
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->body, "ok");
    EXPECT_FALSE(response->has_header("Connection"));
    EXPECT_TRUE(response->has_header("Date"));
  }
  client.send(post("/echo", "hello"));
  EXPECT_EQ(client.read_response()->body, "5:hello");
  client.send(chunked_post("/echo", "3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n"));
  EXPECT_EQ(client.read_response()->body, "7:abcdefg");
  EXPECT_EQ(exchange(get("/nowhere")).status, 404);
}

TEST_F(HttpTransportTest, RequestLineLongerThanTheLimitIs414BeforeItEnds) {
  start();
  // 9000 bytes of a request line with no end: decided from what arrived, without the rest.
  expect_refused("GET /" + std::string(9000, 'a'), 414,
                 "the request line is longer than 8192 bytes");
  expect_refused(get("/" + std::string(8200, 'a')), 414, "longer than 8192");
  EXPECT_EQ(exchange(get("/health?" + std::string(8000, 'q'))).status, 200);
  EXPECT_EQ(app_.refusals().back().status, 414);
}

TEST_F(HttpTransportTest, HeaderFieldsBeyondTheLimitsAre431) {
  start();
  expect_refused(get("/health", "X-Big: " + std::string(60 << 10, 'b') +
                                    "\r\nX-Big2: " + std::string(6 << 10, 'b') + "\r\n"),
                 431, "longer than 65536 bytes");
  expect_refused(get("/health", "X-Big: " + std::string(70 << 10, 'b') + "\r\n"), 431,
                 "a header field is longer than 65532 bytes");
  // Past Beast's own header limit (line + fields), without sending the end of the head.
  expect_refused("GET /health HTTP/1.1\r\nX-Big: " + std::string(100 << 10, 'b'), 431,
                 "longer than 65536 bytes");
  std::string fields;
  for (int i = 0; i < 100; ++i) fields += "X-F" + std::to_string(i) + ": v\r\n";
  expect_refused(get("/health", fields), 431, "more than 100 header fields");  // + Host = 101
  EXPECT_EQ(app_.handled_count(), 0);
}

// The head in many small writes: the parser takes it field by field over several reads, and the
// field bytes are counted over all of them (10 x 7000 bytes is past 64 KiB).
TEST_F(HttpTransportTest, HeaderFieldsArrivingInPiecesAreCountedWhole) {
  start();
  RawClient client(port_);
  ASSERT_TRUE(client.send("GET /health HTTP/1.1\r\nHost: t\r\n"));
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client.send("X-Pad-" + std::to_string(i) + ": " + std::string(7000, 'p') + "\r\n"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  client.send("\r\n");
  const std::optional<RawResponse> response = client.read_response(5);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 431) << response->body;
  EXPECT_EQ(app_.handled_count(), 0);
}

TEST_F(HttpTransportTest, BodyLimitIs413AtTheHeadAndWhenAChunkedTotalPassesIt) {
  TransportOptions options;
  options.max_body_bytes = 1000;
  start(options);
  // The body is never sent: the head decides.
  expect_refused("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n", 413,
                 "larger than 1000 bytes");
  EXPECT_EQ(exchange(post("/echo", std::string(1000, 'x'))).body.substr(0, 5), "1000:");
  // Chunked: 600 bytes pass, the next chunk header would take the total to 1200.
  RawClient client(port_);
  client.send(chunked_post("/echo", "258\r\n" + std::string(600, 'y') + "\r\n258\r\n"));
  const std::optional<RawResponse> response = client.read_response(5);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 413);
  EXPECT_TRUE(client.wait_closed(1.0));
  EXPECT_EQ(app_.refusals().back().method, "POST");
  EXPECT_EQ(app_.refusals().back().path, "/echo");
}

TEST_F(HttpTransportTest, FramingErrorsAre400AndCloseAtOnce) {
  start();
  const std::string post_head = "POST /echo HTTP/1.1\r\nHost: t\r\n";
  const std::pair<std::string, std::string_view> cases[] = {
      {post_head + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello", "different values"},
      {post_head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       "Transfer-Encoding cannot"},
      {post_head + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
       "Content-Length must be"},
      {post_head + "Content-Length: -1\r\n\r\n", "Content-Length must be"},
      {post_head + "Content-Length: abc\r\n\r\n", "Content-Length must be"},
      {post_head + "Content-Length: 1e3\r\n\r\n", "Content-Length must be"},
      {post_head + "Content-Length: 0x1d\r\n\r\n", "Content-Length must be"},
      {post_head + "Content-Length: +29\r\n\r\n", "Content-Length must be"},
      {post_head + "Content-Length: 18446744073709551616\r\n\r\n", "Content-Length must be"},
      {chunked_post("/echo", "zz\r\nhello\r\n0\r\n\r\n"), "chunked body is malformed"},
      {chunked_post("/echo", "-1\r\nhello\r\n0\r\n\r\n"), "chunked body is malformed"},
      {chunked_post("/echo", "5\r\nhelloXX0\r\n\r\n"), "chunked body is malformed"},
      {"GET /health HTTP/1.2\r\nHost: t\r\n\r\n", "must end with HTTP/1.1"},
      {"GET /health\r\n\r\n", "target is not valid"},
      {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "must end with HTTP/1.1"},
      {"GET / health HTTP/1.1\r\nHost: t\r\n\r\n", "HTTP/1.1"},
      {"GET /health HTTP/1.1\nHost: t\n\n", "and CRLF"},
      {"GET /health HTTP/1.1\r\n\r\n", "exactly one Host"},
      {"GET /health HTTP/1.1\r\nHost: t\r\nNoColon\r\n\r\n", "header field line is malformed"},
      {std::string("GET /health HTTP/1.1\r\nHost: t\r\nX-Nul: a") + '\0' + "b\r\n\r\n",
       "not valid"},
  };
  for (const auto& [request, message] : cases) expect_refused(request, 400, message);
  EXPECT_EQ(app_.handled_count(), 0);
}

TEST_F(HttpTransportTest, TransferAndContentEncodingsAreRefusedNeverDecoded) {
  start();
  expect_refused(
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
      "'gzip, chunked' is not supported");
  expect_refused(post("/echo", "\x1f\x8b compressed", "Content-Encoding: gzip\r\n"), 415,
                 "Content-Encoding 'gzip' is not supported");
  EXPECT_EQ(app_.handled_count(), 0);
  EXPECT_EQ(exchange(get("/health", "Content-Encoding: gzip\r\n")).status, 200);  // no body
}

TEST_F(HttpTransportTest, RangeIsIgnored) {
  start();
  const RawResponse response = exchange(get("/health", "Range: bytes=0-0,0-,0-,0-\r\n"));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "ok");
  EXPECT_FALSE(response.has_header("Content-Range"));
}

TEST_F(HttpTransportTest, ExpectContinueIsAnsweredOnlyAfterCheckHeadAccepts) {
  start();
  RawClient client(port_);
  client.send(
      "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  const std::optional<RawResponse> interim = client.read_response(5, /*keep_interim=*/true);
  ASSERT_TRUE(interim.has_value());
  EXPECT_EQ(interim->status, 100);
  client.send("hello");
  EXPECT_EQ(client.read_response()->body, "5:hello");

  // Refused by check_head: no 100, the body is never read, the connection closes.
  RawClient refused(port_);
  refused.send(
      "POST /refuse HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: "
      "10000000\r\n\r\n");
  const std::optional<RawResponse> answer = refused.read_response(5, /*keep_interim=*/true);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status, 401);
  EXPECT_EQ(answer->header("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(answer->header("Connection"), "close");
  EXPECT_TRUE(refused.wait_closed(3.0));
}

TEST_F(HttpTransportTest, PipelinedRequestsAreAllAnsweredInOrder) {
  start();
  RawClient client(port_);
  client.send(get("/health") + post("/echo", "first") + post("/echo", "second!") +
              chunked_post("/echo", "1\r\nz\r\n0\r\n\r\n") +
              get("/health", "Connection: close\r\n"));
  const std::vector<std::string> expected = {"ok", "5:first", "7:second!", "1:z", "ok"};
  for (const std::string& body : expected) {
    const std::optional<RawResponse> response = client.read_response();
    ASSERT_TRUE(response.has_value()) << "missing the response " << body;
    EXPECT_EQ(response->body, body);
  }
  EXPECT_TRUE(client.wait_closed(2.0));
}

TEST_F(HttpTransportTest, APipelinedRequestWaitsUntilTheOneBeforeIsWritten) {
  start();
  RawClient client(port_);
  client.send(post("/slow", "x") + get("/health"));
  std::shared_ptr<Exchange> slow = app_.wait_held(0);
  ASSERT_NE(slow, nullptr);
  EXPECT_TRUE(client.stays_silent(0.3));  // /health is not parsed while /slow is in flight
  EXPECT_EQ(app_.handled_count(), 1);
  slow->respond({200, {}, "slow done"});
  EXPECT_EQ(client.read_response()->body, "slow done");
  EXPECT_EQ(client.read_response()->body, "ok");
}

TEST_F(HttpTransportTest, HalfClosedClientGetsItsResponseAndIsNotGone) {
  start();
  RawClient client(port_);
  client.send(post("/slow", "x"));
  client.shutdown_write();  // like `nc -N`: done sending, still reading
  std::shared_ptr<Exchange> slow = app_.wait_held(0);
  ASSERT_NE(slow, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // probes go out meanwhile
  EXPECT_FALSE(slow->gone());
  slow->respond({200, {}, "answered"});
  const std::optional<RawResponse> response = client.read_response();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->body, "answered");
  EXPECT_GE(client.interim_responses(), 1);  // 102 Processing probes
  EXPECT_TRUE(client.wait_closed(2.0));      // closed after the response
  EXPECT_EQ(app_.gone_count(), 0);
}

TEST_F(HttpTransportTest, FullCloseAndResetAreNoticedAsGone) {
  start();
  RawClient closing(port_);
  closing.send(post("/slow", "x"));
  ASSERT_NE(app_.wait_held(0), nullptr);
  const double closed_at = now_s();
  closing.close();
  EXPECT_TRUE(app_.wait_gone(1, 3.0));
  const double noticed_after = now_s() - closed_at;
  EXPECT_LT(noticed_after, 1.0) << "the probe should notice a closed peer within ~100-300 ms";
  RawClient resetting(port_);
  resetting.send(post("/slow", "y"));
  ASSERT_NE(app_.wait_held(1), nullptr);
  resetting.reset();
  EXPECT_TRUE(app_.wait_gone(2, 3.0));
  EXPECT_TRUE(app_.wait_held(1)->gone());
}

TEST_F(HttpTransportTest, Http10EndOfInputAndAClosedStreamAreGone) {
  start();
  RawClient old_client(port_);
  old_client.send("POST /slow HTTP/1.0\r\nContent-Length: 1\r\n\r\nx");
  ASSERT_NE(app_.wait_held(0), nullptr);
  old_client.shutdown_write();  // HTTP/1.0 has no half-close: EOF means gone
  EXPECT_TRUE(app_.wait_gone(1, 3.0));
  RawClient streaming(port_);
  streaming.send(get("/stream"));
  std::shared_ptr<Exchange> stream = app_.wait_held(1);
  ASSERT_NE(stream, nullptr);
  stream->write("data: 1\n\n");
  ASSERT_TRUE(streaming.read_response(0.5) == std::nullopt);  // the stream is still open
  streaming.close();  // keep-alive chunks probe the closed peer
  EXPECT_TRUE(app_.wait_gone(2, 3.0));
  EXPECT_TRUE(stream->gone());
}

TEST_F(HttpTransportTest, HandleRunsOnWorkerThreadsNotOnIoThreads) {
  start();
  RawClient client(port_);
  for (int i = 0; i < 8; ++i) {
    client.send(get("/health"));
    ASSERT_TRUE(client.read_response().has_value());
  }
  const auto [io_threads, worker_threads] = app_.threads();
  EXPECT_FALSE(io_threads.empty());
  EXPECT_FALSE(worker_threads.empty());
  for (std::thread::id id : worker_threads) EXPECT_EQ(io_threads.count(id), 0u);
}

TEST_F(HttpTransportTest, StreamsAreChunkedAndKeepTheConnection) {
  start();
  RawClient client(port_);
  client.send(get("/stream"));
  std::shared_ptr<Exchange> stream = app_.wait_held(0);
  ASSERT_NE(stream, nullptr);
  stream->write("data: 1\n\n");
  stream->write("");  // ignored: an empty chunk would end the body
  stream->write("data: 2\n\n");
  stream->end_stream();
  const std::optional<RawResponse> response = client.read_response();
  ASSERT_TRUE(response.has_value());
  EXPECT_TRUE(response->chunked);
  EXPECT_EQ(response->header("Content-Type"), "text/event-stream");
  EXPECT_EQ(response->body, "data: 1\n\ndata: 2\n\n");
  client.send(get("/health"));
  EXPECT_EQ(client.read_response()->body, "ok");
}

TEST_F(HttpTransportTest, HalfClosedStreamGetsKeepaliveChunksAndItsEnd) {
  start();
  RawClient client(port_);
  client.send(get("/stream"));
  client.shutdown_write();
  std::shared_ptr<Exchange> stream = app_.wait_held(0);
  ASSERT_NE(stream, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  stream->write("data: last\n\n");
  stream->end_stream();
  const std::optional<RawResponse> response = client.read_response();
  ASSERT_TRUE(response.has_value());
  EXPECT_NE(response->body.find(":\n\n"), std::string::npos);  // the keep-alive probe chunks
  EXPECT_NE(response->body.find("data: last\n\n"), std::string::npos);
  EXPECT_EQ(app_.gone_count(), 0);
}

TEST_F(HttpTransportTest, Http10GetsCloseDelimitedStreamsAndClosedResponses) {
  start();
  RawClient client(port_);
  client.send("GET /stream HTTP/1.0\r\n\r\n");
  std::shared_ptr<Exchange> stream = app_.wait_held(0);
  ASSERT_NE(stream, nullptr);
  stream->write("one,");
  stream->write("two");
  stream->end_stream();
  const std::optional<RawResponse> response = client.read_response();
  ASSERT_TRUE(response.has_value());
  EXPECT_TRUE(response->close_delimited);
  EXPECT_FALSE(response->has_header("Content-Length"));
  EXPECT_FALSE(response->has_header("Transfer-Encoding"));
  EXPECT_EQ(response->body, "one,two");

  RawClient plain(port_);
  plain.send("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  const std::optional<RawResponse> health = plain.read_response();
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->header("Content-Length"), "2");
  EXPECT_EQ(health->header("Connection"), "close");
  EXPECT_TRUE(plain.wait_closed(2.0));
}

TEST_F(HttpTransportTest, DrainAnswersTheRequestInFlightThenStopReturns) {
  start();
  RawClient idle(port_);
  idle.send(get("/health"));
  ASSERT_TRUE(idle.read_response().has_value());
  RawClient busy(port_);
  busy.send(post("/slow", "x"));
  std::shared_ptr<Exchange> slow = app_.wait_held(0);
  ASSERT_NE(slow, nullptr);
  transport_->drain();
  EXPECT_TRUE(idle.wait_closed(2.0)) << "an idle keep-alive connection closes at drain";
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    transport_->stop(std::chrono::steady_clock::now() + std::chrono::seconds(30));
    stopped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(stopped) << "stop() waits for the exchange in flight";
  slow->respond({200, {}, "finished during drain"});
  const std::optional<RawResponse> response = busy.read_response();
  stopper.join();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->body, "finished during drain");
  EXPECT_EQ(response->header("Connection"), "close");
  EXPECT_EQ(app_.gone_count(), 0);
}

TEST_F(HttpTransportTest, StopAtItsDeadlineMakesTheUnansweredExchangeGone) {
  start();
  RawClient client(port_);
  client.send(post("/slow", "x"));
  ASSERT_NE(app_.wait_held(0), nullptr);
  const double before = now_s();
  transport_->stop(std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  EXPECT_LT(now_s() - before, 3.0);
  EXPECT_EQ(app_.gone_count(), 1);
  EXPECT_TRUE(client.wait_closed(1.0));
  app_.wait_held(0)->respond({200, {}, "late"});  // ignored, no crash
}

TEST_F(HttpTransportTest, AnIdleConnectionIsEvictedForANewOneAtThePerClientLimit) {
  TransportOptions options;
  options.max_connections_per_client = 3;
  start(options);
  RawClient oldest(port_), newer(port_), busy(port_);
  for (RawClient* client : {&oldest, &newer}) {
    client->send(get("/health"));
    ASSERT_TRUE(client->read_response().has_value());
  }
  busy.send(post("/slow", "x"));  // a request in flight: not idle
  ASSERT_NE(app_.wait_held(0), nullptr);
  // Settle: the idle ones are marked idle just after their responses were written.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  RawClient fresh(port_);
  fresh.send(get("/health"));
  EXPECT_EQ(fresh.read_response()->body, "ok");
  EXPECT_TRUE(oldest.wait_closed(2.0)) << "the least recently used idle connection is evicted";
  EXPECT_TRUE(newer.stays_silent(0.2));
  newer.send(get("/health"));
  EXPECT_EQ(newer.read_response()->body, "ok");
  app_.release_all();
  EXPECT_EQ(busy.read_response()->body, "released");
}

TEST_F(HttpTransportTest, BeyondTheLimitsWithNoIdleConnectionIs503) {
  TransportOptions options;
  options.max_connections_per_client = 2;
  options.max_connections = 3;
  start(options);
  RawClient first(port_), second(port_);
  first.send(post("/slow", "1"));  // both busy (held by the application): nothing to evict
  second.send(post("/slow", "2"));
  ASSERT_NE(app_.wait_held(1), nullptr);
  RawClient third(port_);
  const std::optional<RawResponse> refused = third.read_response(5);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(refused->header("Retry-After"), "1");
  EXPECT_EQ(refused->header("Connection"), "close");
  EXPECT_NE(refused->body.find("max_connections_per_client"), std::string::npos);
  EXPECT_TRUE(third.wait_closed(3.0));
  // Another client address has its own allowance, until max_connections.
  RawClient other(port_, "127.0.0.2");
  if (!other.connected()) GTEST_SKIP() << "cannot bind 127.0.0.2 here";
  other.send(post("/slow", "3"));
  ASSERT_NE(app_.wait_held(2), nullptr);
  RawClient fourth(port_, "127.0.0.3");
  const std::optional<RawResponse> full = fourth.read_response(5);
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->status, 503);
  EXPECT_NE(full->body.find("(max_connections)"), std::string::npos);
  app_.release_all();
  EXPECT_EQ(other.read_response()->body, "released");
}

TEST_F(HttpTransportTest, SlowlorisAndSilentConnectionsDoNotStarveOthers) {
  start();  // default limits: 64 per client, so the silent ones also exercise idle eviction
  std::vector<std::unique_ptr<RawClient>> slow, silent;
  for (int i = 0; i < 50; ++i) {
    slow.push_back(std::make_unique<RawClient>(port_));
    slow.back()->send("GET /health HTTP/1.1\r\nHost: t\r\nX-a: ");
  }
  for (int i = 0; i < 40; ++i) silent.push_back(std::make_unique<RawClient>(port_));
  std::atomic<bool> done{false};
  std::thread trickle([&] {  // one byte per connection every 100 ms
    while (!done) {
      for (auto& client : slow) client->send("a");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  for (int probe = 0; probe < 3; ++probe) {
    const double begin = now_s();
    RawClient client(port_);
    client.send(get("/health"));
    const std::optional<RawResponse> response = client.read_response(5);
    EXPECT_TRUE(response.has_value() && response->status == 200);
    EXPECT_LT(now_s() - begin, 1.0) << "probe " << probe;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  done = true;
  trickle.join();
}

TEST_F(HttpTransportTest, TimeoutsEndHeadsBodiesAndIdleConnections) {
  TransportOptions options;
  options.head_timeout_s = 0.3;
  options.body_timeout_s = 0.3;
  options.idle_timeout_s = 0.3;
  start(options);
  // The head timeout runs from the first byte, however fast the bytes trickle.
  RawClient slow_head(port_);
  slow_head.send("GET /health HTTP/1.1\r\n");
  std::optional<RawResponse> response;
  const double begin = now_s();
  while (!response && now_s() - begin < 5) {
    slow_head.send("X");
    response = slow_head.read_response(0.05);
  }
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 408);
  EXPECT_NE(response->body.find("head did not arrive"), std::string::npos);
  RawClient slow_body(port_);
  slow_body.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc");
  response = slow_body.read_response(5);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 408);
  EXPECT_TRUE(slow_body.wait_closed(2.0));
  RawClient idle(port_);
  std::string bytes;
  EXPECT_TRUE(idle.wait_closed(5.0, &bytes));
  EXPECT_EQ(bytes, "") << "an idle connection closes silently";
}

TEST_F(HttpTransportTest, AResponseTheClientDoesNotReadEndsAtTheWriteTimeout) {
  TransportOptions options;
  options.write_timeout_s = 0.5;
  start(options);
  RawClient client(port_);
  client.send(get("/big"));  // 64 MiB; never read
  EXPECT_TRUE(app_.wait_gone(1, 20.0));
}

TEST_F(HttpTransportTest, StartRefusesABoundPortAndBadOptions) {
  start();
  Transport second(app_);
  TransportOptions options;
  options.host = "127.0.0.1";
  options.port = port_;
  const absl::Status status = second.start(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("127.0.0.1:" + std::to_string(port_)), std::string::npos);
  Transport third(app_);
  options.port = 0;
  options.tls_cert_pem = "not a certificate";
  options.tls_key_pem = "not a key";
  EXPECT_EQ(third.start(options).code(), absl::StatusCode::kInvalidArgument);
  Transport fourth(app_);
  options.tls_key_pem = "";
  EXPECT_EQ(fourth.start(options).code(), absl::StatusCode::kInvalidArgument);
}

// A self-signed certificate from the openssl CLI; empty when it is not installed.
std::pair<std::string, std::string> make_certificate() {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) return {};
  char dir[] = "/tmp/flux2-tls-XXXXXX";
  if (mkdtemp(dir) == nullptr) return {};
  const std::string base(dir);
  const std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=localhost -keyout " +
      base + "/key.pem -out " + base + "/cert.pem 2>/dev/null";
  if (std::system(command.c_str()) != 0) return {};
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  std::pair<std::string, std::string> pem{read(base + "/cert.pem"), read(base + "/key.pem")};
  std::system(("rm -rf " + base).c_str());
  return pem;
}

TEST_F(HttpTransportTest, TlsHandshakeThenARequest) {
  const auto [cert, key] = make_certificate();
  if (cert.empty()) GTEST_SKIP() << "no openssl CLI to make a test certificate";
  TransportOptions options;
  options.tls_cert_pem = cert;
  options.tls_key_pem = key;
  start(options);
  RawClient socket(port_);
  ASSERT_TRUE(socket.connected());
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(context);
  SSL_set_fd(ssl, socket.fd());
  ASSERT_EQ(SSL_connect(ssl), 1) << "TLS handshake failed";
  const std::string request = get("/health", "Connection: close\r\n");
  ASSERT_EQ(SSL_write(ssl, request.data(), static_cast<int>(request.size())),
            static_cast<int>(request.size()));
  std::string received;
  char chunk[4096];
  int got;
  while ((got = SSL_read(ssl, chunk, sizeof(chunk))) > 0) received.append(chunk, got);
  EXPECT_EQ(received.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << received;
  EXPECT_EQ(received.substr(received.size() - 4), "\r\nok");
  SSL_free(ssl);
  SSL_CTX_free(context);
}

}  // namespace
}  // namespace flux2::server::http
