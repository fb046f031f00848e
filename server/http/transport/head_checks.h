// The transport's decisions about a request head, as pure functions: 414 (request line too long,
// decided from the bytes received), 431 (too many or too large header fields), 400 (version, Host,
// framing errors Beast's parser reports), 501 (a Transfer-Encoding other than chunked), 415 (a
// compressed body). No sockets: tested by tests/server/http_transport_test.cc
//   build-http/bin/http_transport_tests --gtest_filter='HttpHeadChecks*'
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>

#include "server/http/transport/message.h"
#include "server/http/transport/options.h"

namespace flux2::server::http {

// A refusal decided from the head alone: the status and a message that says what is wrong.
struct HeadProblem {
  int status = 400;
  std::string message;
};

// What the connection measured of a parsed head, beside the fields themselves.
struct HeadFacts {
  int64_t request_line_bytes = 0;  // the request line without its CRLF
  int64_t field_bytes = 0;         // every header field line with its CRLF
  int field_count = 0;
  bool has_body = false;  // Content-Length > 0 or chunked
};

// The length of the request line that starts `bytes` (without CR LF), or nullopt while its LF
// has not arrived.
std::optional<int64_t> request_line_length(std::string_view bytes);

// 414 as soon as the buffered start of a request shows a request line longer than
// options.max_request_line_bytes (complete or not); nullopt otherwise.
std::optional<HeadProblem> check_request_line(std::string_view bytes,
                                              const TransportOptions& options);

// The checks of a parsed head, first failure wins: version other than 1.0/1.1 (400), request line
// (414), field count and bytes (431), Host missing or repeated on HTTP/1.1 (400),
// Transfer-Encoding other than exactly "chunked" (501), Content-Encoding other than identity on a
// request with a body (415). nullopt when the head passes.
std::optional<HeadProblem> check_request_head(const RequestHead& head, const HeadFacts& facts,
                                              const TransportOptions& options);

// A parse error of Beast's request parser (boost::beast::http::error) as a refusal: header_limit
// -> 431, body_limit -> 413, every framing or syntax error -> 400 with what was wrong.
HeadProblem problem_of_parse_error(const boost::system::error_code& error,
                                   const TransportOptions& options);

}  // namespace flux2::server::http
