// What the HTTP/1.1 transport hands the application and takes back: RequestHead (line and fields
// as sent), Request (+ body), Response, Refusal (a request the transport refused itself), and the
// wire form of responses (head, chunks). Pure functions; tested by
// tests/server/http_transport_test.cc
//   build-http/bin/http_transport_tests --gtest_filter='HttpMessage*'
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flux2::server::http {

using HeaderFields = std::vector<std::pair<std::string, std::string>>;

// ASCII case-insensitive equality (header names, tokens such as "chunked").
bool ascii_iequals(std::string_view a, std::string_view b);
// `text` without leading and trailing spaces and tabs (HTTP's optional whitespace).
std::string_view trim_ows(std::string_view text);

// The request line and header fields, as the client sent them; what Application::check_head sees.
struct RequestHead {
  std::string method;    // e.g. "POST" (case as sent; methods are case-sensitive)
  std::string target;    // e.g. "/v1/images/generations?x=1" (not percent-decoded)
  std::string path;      // target before '?'
  int version = 11;      // 10 or 11 (HTTP/1.0, HTTP/1.1)
  HeaderFields headers;  // in order, as sent (names keep their case)
  std::string peer;      // "address:port" of the client

  // Every value of the fields named `name` (case-insensitive), in order. The views point into
  // `headers`: valid while this head lives and is not modified.
  std::vector<std::string_view> values(std::string_view name) const;
  // The value when exactly one field is named `name`; nullopt when there is none OR several (a
  // repeated Authorization or Content-Type is not silently resolved: use values() to tell).
  std::optional<std::string_view> value(std::string_view name) const;
};

struct Request : RequestHead {
  std::string body;  // whole (de-chunked) body; at most TransportOptions::max_body_bytes
};

struct Response {
  int status = 200;
  // The transport owns the framing: Content-Length, Transfer-Encoding and Connection given here
  // are dropped (Connection: close is honoured as "close after this response"), and so is any
  // field whose name or value holds CR, LF or NUL.
  HeaderFields headers;
  std::string body;
};

// A request the transport refused itself (Application::render_refusal renders it).
struct Refusal {
  int status = 400;     // 400, 408, 413, 414, 415, 431, 501 or 503
  std::string message;  // e.g. "the request line is longer than 8192 bytes"
  std::string method;   // empty when the request line did not parse
  std::string path;
  std::string peer;  // "address:port"
};

// How a response's body is delimited on the wire.
enum class BodyFraming {
  kContentLength,   // Content-Length: n, then n bytes
  kChunked,         // Transfer-Encoding: chunked (HTTP/1.1 streams)
  kCloseDelimited,  // no length: the body ends when the connection closes (HTTP/1.0 streams)
  kNoBody,          // 1xx, 204 and 304: no body and no length field
};

// The status line and fields of a response, ending with the blank line. Adds the framing field
// (Content-Length: `content_length` for kContentLength), `Connection: close` when `close`, and a
// Date; drops the application's framing fields and unsafe ones (see Response::headers).
std::string render_response_head(int status, const HeaderFields& headers, BodyFraming framing,
                                 int64_t content_length, bool close);
// One chunk of a chunked body: hex size, CRLF, the bytes, CRLF. Empty `data` gives "" (an empty
// chunk would end the body).
std::string render_chunk(std::string_view data);
// The end of a chunked body (the zero chunk, no trailers).
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";
// Whether the application's fields ask to close the connection after the response.
bool asks_to_close(const HeaderFields& headers);
// The reason phrase of `status` ("Not Found"), "Unknown" for codes without one.
std::string_view reason_phrase(int status);

}  // namespace flux2::server::http
