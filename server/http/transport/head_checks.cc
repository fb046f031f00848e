// The transport's head checks and Beast parse-error mapping; see head_checks.h.
// Tested by tests/server/http_transport_test.cc (HttpHeadChecks*).
#include "server/http/transport/head_checks.h"

#include <boost/beast/http/error.hpp>

namespace flux2::server::http {
namespace {

namespace bhttp = boost::beast::http;

std::string joined(const std::vector<std::string_view>& values) {
  std::string text;
  for (std::string_view value : values) {
    if (!text.empty()) text += ", ";
    text += value;
  }
  return text;
}

std::optional<HeadProblem> check_framing(const RequestHead& head, const HeadFacts& facts) {
  const std::vector<std::string_view> te = head.values("Transfer-Encoding");
  if (!te.empty() && (te.size() != 1 || !ascii_iequals(trim_ows(te.front()), "chunked"))) {
    return HeadProblem{501, "Transfer-Encoding '" + joined(te) +
                                "' is not supported: only 'chunked' is (send the body as is)"};
  }
  if (!facts.has_body) return std::nullopt;
  for (std::string_view encoding : head.values("Content-Encoding")) {
    if (!ascii_iequals(trim_ows(encoding), "identity")) {
      return HeadProblem{415, "Content-Encoding '" + std::string(encoding) +
                                  "' is not supported: send the body uncompressed"};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> request_line_length(std::string_view bytes) {
  const size_t lf = bytes.find('\n');
  if (lf == std::string_view::npos) return std::nullopt;
  return static_cast<int64_t>(lf > 0 && bytes[lf - 1] == '\r' ? lf - 1 : lf);
}

std::optional<HeadProblem> check_request_line(std::string_view bytes,
                                              const TransportOptions& options) {
  const std::optional<int64_t> length = request_line_length(bytes);
  // Incomplete: the line is too long once more than the limit and its CR arrived without an LF.
  const bool too_long =
      length ? *length > options.max_request_line_bytes
             : static_cast<int64_t>(bytes.size()) > options.max_request_line_bytes + 1;
  if (!too_long) return std::nullopt;
  return HeadProblem{414, "the request line is longer than " +
                              std::to_string(options.max_request_line_bytes) + " bytes"};
}

std::optional<HeadProblem> check_request_head(const RequestHead& head, const HeadFacts& facts,
                                              const TransportOptions& options) {
  if (head.version != 10 && head.version != 11) {
    return HeadProblem{400, "HTTP/" + std::to_string(head.version / 10) + "." +
                                std::to_string(head.version % 10) +
                                " is not supported: send HTTP/1.1 (or HTTP/1.0)"};
  }
  if (facts.request_line_bytes > options.max_request_line_bytes) {
    return HeadProblem{414, "the request line is longer than " +
                                std::to_string(options.max_request_line_bytes) + " bytes"};
  }
  if (facts.field_count > options.max_header_fields) {
    return HeadProblem{431, "the request has more than " +
                                std::to_string(options.max_header_fields) + " header fields"};
  }
  if (facts.field_bytes > options.max_header_bytes) {
    return HeadProblem{431, "the request header fields are longer than " +
                                std::to_string(options.max_header_bytes) + " bytes"};
  }
  if (head.version == 11 && head.values("Host").size() != 1) {
    return HeadProblem{400, "an HTTP/1.1 request needs exactly one Host field"};
  }
  return check_framing(head, facts);
}

HeadProblem problem_of_parse_error(const boost::system::error_code& error,
                                   const TransportOptions& options) {
  if (error == bhttp::error::header_limit) {
    return {431, "the request header fields are longer than " +
                     std::to_string(options.max_header_bytes) + " bytes"};
  }
  if (error == bhttp::error::body_limit) {
    return {413,
            "the request body is larger than " + std::to_string(options.max_body_bytes) + " bytes"};
  }
  if (error == bhttp::error::multiple_content_length) {
    return {400, "the request has Content-Length fields with different values"};
  }
  if (error == bhttp::error::bad_content_length) {
    return {400,
            "Content-Length must be one decimal number of bytes (no sign, at most 2^64-1) and "
            "cannot come after Transfer-Encoding: chunked"};
  }
  if (error == bhttp::error::bad_transfer_encoding) {
    return {400, "Transfer-Encoding cannot be repeated or come with Content-Length"};
  }
  if (error == bhttp::error::bad_chunk || error == bhttp::error::bad_chunk_extension) {
    return {400,
            "the chunked body is malformed (a bad chunk size, or chunk data not followed by "
            "CRLF)"};
  }
  if (error == bhttp::error::bad_line_ending)
    return {400, "the request's lines must end with CRLF"};
  if (error == bhttp::error::bad_method) return {400, "the request line has no valid method"};
  if (error == bhttp::error::bad_target) return {400, "the request target is not valid"};
  if (error == bhttp::error::bad_version) {
    return {400, "the request line must end with HTTP/1.1 (or HTTP/1.0) and CRLF"};
  }
  if (error == bhttp::error::bad_field) return {400, "a header field line is malformed"};
  if (error == bhttp::error::bad_value) return {400, "a header field value is not valid"};
  if (error == bhttp::error::bad_obs_fold) return {400, "a header field is folded (obs-fold)"};
  return {400, "the request is malformed: " + error.message()};
}

}  // namespace flux2::server::http
