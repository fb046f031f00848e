// The transport's pure parts, without sockets: header lookup and response rendering
// (server/http/transport/message.h), the head checks and Beast parse-error mapping (head_checks.h:
// 414/431/400/501/415 and the framing errors), and the connection registry's limits and LRU idle
// eviction (connection_registry.h).
//   build-http/bin/http_transport_tests
//   --gtest_filter='HttpMessage*:HttpHeadChecks*:HttpConnectionRegistry*'
#include <boost/beast/http/error.hpp>

#include "gtest/gtest.h"
#include "server/http/transport/connection_registry.h"
#include "server/http/transport/head_checks.h"
#include "server/http/transport/message.h"

namespace flux2::server::http {
namespace {

namespace bhttp = boost::beast::http;

TEST(HttpMessage, ValuesAreCaseInsensitiveInOrderAndValueNeedsExactlyOne) {
  RequestHead head;
  head.headers = {{"Host", "a"}, {"X-Tag", "1"}, {"x-tag", "2"}, {"Content-Type", "text/plain"}};
  EXPECT_EQ(head.values("X-TAG"), (std::vector<std::string_view>{"1", "2"}));
  EXPECT_EQ(head.value("content-type"), "text/plain");
  EXPECT_EQ(head.value("X-Tag"), std::nullopt);  // repeated: not silently resolved
  EXPECT_EQ(head.value("Authorization"), std::nullopt);
}

TEST(HttpMessage, ResponseHeadOwnsFramingAndDropsUnsafeFields) {
  const std::string head = render_response_head(200,
                                                {{"Content-Type", "application/json"},
                                                 {"Content-Length", "999"},
                                                 {"Transfer-Encoding", "chunked"},
                                                 {"X-Split", "a\r\nSet-Cookie: evil"},
                                                 {"Connection", "keep-alive"}},
                                                BodyFraming::kContentLength, 12, /*close=*/true);
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\nDate: ", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Type: application/json\r\n"), std::string::npos);
  EXPECT_NE(head.find("Content-Length: 12\r\n"), std::string::npos);
  EXPECT_EQ(head.find("999"), std::string::npos);
  EXPECT_EQ(head.find("chunked"), std::string::npos);
  EXPECT_EQ(head.find("evil"), std::string::npos);
  EXPECT_EQ(head.find("keep-alive"), std::string::npos);
  EXPECT_NE(head.find("Connection: close\r\n\r\n"), std::string::npos);
  const std::string chunked = render_response_head(404, {}, BodyFraming::kChunked, 0, false);
  EXPECT_NE(chunked.find("HTTP/1.1 404 Not Found\r\n"), std::string::npos);
  EXPECT_NE(chunked.find("Transfer-Encoding: chunked\r\n\r\n"), std::string::npos);
  EXPECT_EQ(chunked.find("Connection"), std::string::npos);
}

TEST(HttpMessage, ChunksAndCloseRequests) {
  EXPECT_EQ(render_chunk("hello world, 17 b"), "11\r\nhello world, 17 b\r\n");
  EXPECT_EQ(render_chunk(""), "");
  EXPECT_TRUE(asks_to_close({{"connection", "Keep-Alive, Close"}}));
  EXPECT_FALSE(asks_to_close({{"Connection", "keep-alive"}, {"X-Close", "close"}}));
  EXPECT_EQ(reason_phrase(431), "Request Header Fields Too Large");
  EXPECT_EQ(reason_phrase(299), "Unknown");
}

TransportOptions small_limits() {
  TransportOptions options;
  options.max_request_line_bytes = 20;
  options.max_header_bytes = 100;
  options.max_header_fields = 3;
  return options;
}

TEST(HttpHeadChecks, RequestLineIs414FromTheBytesReceived) {
  const TransportOptions options = small_limits();
  EXPECT_EQ(request_line_length("GET / HTTP/1.1\r\nHost"), 14);
  EXPECT_EQ(request_line_length("GET / HTTP/1.1"), std::nullopt);
  EXPECT_EQ(check_request_line("GET /12345 HTTP/1.1\r\n", options), std::nullopt);  // 19 bytes
  EXPECT_EQ(check_request_line("GET /123456 HTTP/1.1", options), std::nullopt);     // 20, no CR yet
  EXPECT_EQ(check_request_line("GET /123456 HTTP/1.1\r", options), std::nullopt);   // CR arrived
  const std::optional<HeadProblem> incomplete =
      check_request_line("GET /1234567 HTTP/1.1\r", options);
  ASSERT_TRUE(incomplete.has_value());
  EXPECT_EQ(incomplete->status, 414);
  EXPECT_EQ(incomplete->message, "the request line is longer than 20 bytes");
  EXPECT_EQ(check_request_line("GET /1234567 HTTP/1.1\r\n", options)->status, 414);
}

RequestHead head_of(HeaderFields headers, int version = 11) {
  RequestHead head;
  head.method = "POST";
  head.target = head.path = "/x";
  head.version = version;
  head.headers = std::move(headers);
  return head;
}

int status_of(const RequestHead& head, const HeadFacts& facts) {
  const std::optional<HeadProblem> problem = check_request_head(head, facts, small_limits());
  return problem ? problem->status : 0;
}

TEST(HttpHeadChecks, VersionLimitsHostAndEncodings) {
  const HeadFacts plain{10, 20, 1, false};
  HeadFacts with_body = plain;
  with_body.has_body = true;
  EXPECT_EQ(status_of(head_of({{"Host", "a"}}), plain), 0);
  EXPECT_EQ(status_of(head_of({}, 10), plain), 0);                 // HTTP/1.0 needs no Host
  EXPECT_EQ(status_of(head_of({{"Host", "a"}}, 12), plain), 400);  // HTTP/1.2
  EXPECT_EQ(status_of(head_of({{"Host", "a"}}, 20), plain), 400);  // the h2 preface's HTTP/2.0
  EXPECT_EQ(status_of(head_of({}), plain), 400);                   // no Host
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"host", "b"}}), plain), 400);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}}), {21, 20, 1, false}), 414);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}}), {10, 20, 4, false}), 431);   // 4 fields > 3
  EXPECT_EQ(status_of(head_of({{"Host", "a"}}), {10, 101, 1, false}), 431);  // 101 bytes > 100
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Transfer-Encoding", "chunked"}}), with_body), 0);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Transfer-Encoding", " Chunked "}}), with_body), 0);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Transfer-Encoding", "gzip, chunked"}}), with_body),
            501);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Transfer-Encoding", "gzip"}}), plain), 501);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Content-Encoding", "gzip"}}), with_body), 415);
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Content-Encoding", "gzip"}}), plain),
            0);  // no body
  EXPECT_EQ(status_of(head_of({{"Host", "a"}, {"Content-Encoding", "identity"}}), with_body), 0);
  const std::optional<HeadProblem> te = check_request_head(
      head_of({{"Host", "a"}, {"Transfer-Encoding", "gzip, chunked"}}), with_body, small_limits());
  EXPECT_EQ(te->message,
            "Transfer-Encoding 'gzip, chunked' is not supported: only 'chunked' is (send the body "
            "as is)");
}

TEST(HttpHeadChecks, ParseErrorsMapToStatusesWithReasons) {
  const TransportOptions options;
  EXPECT_EQ(problem_of_parse_error(bhttp::error::header_limit, options).status, 431);
  const HeadProblem body = problem_of_parse_error(bhttp::error::body_limit, options);
  EXPECT_EQ(body.status, 413);
  EXPECT_EQ(body.message, "the request body is larger than 50331648 bytes");
  for (bhttp::error error :
       {bhttp::error::multiple_content_length, bhttp::error::bad_content_length,
        bhttp::error::bad_transfer_encoding, bhttp::error::bad_chunk, bhttp::error::bad_version,
        bhttp::error::bad_method, bhttp::error::bad_field, bhttp::error::bad_line_ending}) {
    const HeadProblem problem = problem_of_parse_error(error, options);
    EXPECT_EQ(problem.status, 400) << problem.message;
    EXPECT_EQ(problem.message.find("malformed: "), std::string::npos) << problem.message;
  }
  EXPECT_NE(problem_of_parse_error(bhttp::error::multiple_content_length, options)
                .message.find("different values"),
            std::string::npos);
}

// A connection that records the registry's calls.
struct FakeConnection : RegisteredConnection {
  void evict() override { ++evicted; }
  void begin_drain() override {}
  void force_close() override {}
  void abandon() override {}
  int evicted = 0;
};

TEST(HttpConnectionRegistry, EvictsTheClientsOldestIdleConnectionOrRefuses) {
  ConnectionRegistry registry(/*max_connections=*/10, /*max_connections_per_client=*/2);
  auto a = std::make_shared<FakeConnection>();
  auto b = std::make_shared<FakeConnection>();
  auto c = std::make_shared<FakeConnection>();
  auto other = std::make_shared<FakeConnection>();
  using Verdict = ConnectionRegistry::Verdict;
  EXPECT_EQ(registry.admit(1, "10.0.0.1", a), Verdict::kAdmitted);
  EXPECT_EQ(registry.admit(2, "10.0.0.1", b), Verdict::kAdmitted);
  EXPECT_EQ(registry.admit(3, "10.0.0.1", c), Verdict::kTooManyFromClient);  // none idle
  EXPECT_EQ(registry.admit(4, "10.0.0.2", other), Verdict::kAdmitted);       // another client
  registry.mark_idle(2);
  registry.mark_idle(1);  // 2 has been idle longer
  EXPECT_EQ(registry.admit(3, "10.0.0.1", c), Verdict::kAdmitted);
  EXPECT_EQ(b->evicted, 1);
  EXPECT_EQ(a->evicted, 0);
  EXPECT_FALSE(registry.mark_busy(2));  // evicted: its first bytes must not be served
  EXPECT_TRUE(registry.mark_busy(1));
  EXPECT_EQ(registry.count_of("10.0.0.1"), 2);
  EXPECT_EQ(registry.size(), 3u);
  registry.remove(1);
  registry.remove(1);  // idempotent
  EXPECT_EQ(registry.count_of("10.0.0.1"), 1);
}

TEST(HttpConnectionRegistry, GlobalLimitEvictsAnyClientsIdleConnection) {
  ConnectionRegistry registry(/*max_connections=*/2, /*max_connections_per_client=*/10);
  auto a = std::make_shared<FakeConnection>();
  auto b = std::make_shared<FakeConnection>();
  auto c = std::make_shared<FakeConnection>();
  using Verdict = ConnectionRegistry::Verdict;
  EXPECT_EQ(registry.admit(1, "10.0.0.1", a), Verdict::kAdmitted);
  EXPECT_EQ(registry.admit(2, "10.0.0.2", b), Verdict::kAdmitted);
  EXPECT_EQ(registry.admit(3, "10.0.0.3", c), Verdict::kTooManyConnections);
  registry.mark_idle(1);
  EXPECT_EQ(registry.admit(3, "10.0.0.3", c), Verdict::kAdmitted);
  EXPECT_EQ(a->evicted, 1);
  EXPECT_EQ(registry.connections().size(), 2u);
}

}  // namespace
}  // namespace flux2::server::http
