// Header lookup and the wire form of responses; see message.h.
// Tested by tests/server/http_transport_test.cc (HttpMessage*).
#include "server/http/transport/message.h"

#include <time.h>

#include <array>
#include <chrono>
#include <cstdio>

namespace flux2::server::http {
namespace {

char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool has_unsafe_byte(std::string_view text) {
  return text.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

// Fields the transport writes itself (framing and connection management).
bool is_transport_field(std::string_view name) {
  return ascii_iequals(name, "Content-Length") || ascii_iequals(name, "Transfer-Encoding") ||
         ascii_iequals(name, "Connection") || ascii_iequals(name, "Date");
}

// An IMF-fixdate (RFC 9110 section 5.6.7) of now: "Sun, 06 Nov 1994 08:49:37 GMT".
std::string http_date_now() {
  const time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  tm utc{};
  gmtime_r(&now, &utc);
  static constexpr std::array<const char*, 7> kDays = {"Sun", "Mon", "Tue", "Wed",
                                                       "Thu", "Fri", "Sat"};
  static constexpr std::array<const char*, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                          "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  char text[40];
  std::snprintf(text, sizeof(text), "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[utc.tm_wday % 7],
                utc.tm_mday, kMonths[utc.tm_mon % 12], utc.tm_year + 1900, utc.tm_hour, utc.tm_min,
                utc.tm_sec);
  return text;
}

// Reason phrases of the statuses an inference API sends (RFC 9110 section 15).
constexpr std::pair<int, std::string_view> kReasons[] = {
    {100, "Continue"},
    {101, "Switching Protocols"},
    {102, "Processing"},
    {200, "OK"},
    {201, "Created"},
    {202, "Accepted"},
    {204, "No Content"},
    {301, "Moved Permanently"},
    {302, "Found"},
    {303, "See Other"},
    {304, "Not Modified"},
    {307, "Temporary Redirect"},
    {308, "Permanent Redirect"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {408, "Request Timeout"},
    {409, "Conflict"},
    {410, "Gone"},
    {411, "Length Required"},
    {413, "Content Too Large"},
    {414, "URI Too Long"},
    {415, "Unsupported Media Type"},
    {417, "Expectation Failed"},
    {422, "Unprocessable Content"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {500, "Internal Server Error"},
    {501, "Not Implemented"},
    {502, "Bad Gateway"},
    {503, "Service Unavailable"},
    {504, "Gateway Timeout"},
    {505, "HTTP Version Not Supported"},
};

}  // namespace

bool ascii_iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::vector<std::string_view> RequestHead::values(std::string_view name) const {
  std::vector<std::string_view> found;
  for (const auto& [field, value] : headers) {
    if (ascii_iequals(field, name)) found.emplace_back(value);
  }
  return found;
}

std::optional<std::string_view> RequestHead::value(std::string_view name) const {
  const std::vector<std::string_view> found = values(name);
  if (found.size() != 1) return std::nullopt;
  return found.front();
}

std::string render_response_head(int status, const HeaderFields& headers, BodyFraming framing,
                                 int64_t content_length, bool close) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " ";
  head.append(reason_phrase(status));
  head.append("\r\nDate: ").append(http_date_now()).append("\r\n");
  for (const auto& [name, value] : headers) {
    if (name.empty() || is_transport_field(name) || has_unsafe_byte(name) ||
        has_unsafe_byte(value)) {
      continue;
    }
    head.append(name).append(": ").append(value).append("\r\n");
  }
  switch (framing) {
    case BodyFraming::kContentLength:
      head.append("Content-Length: ").append(std::to_string(content_length)).append("\r\n");
      break;
    case BodyFraming::kChunked:
      head.append("Transfer-Encoding: chunked\r\n");
      break;
    case BodyFraming::kCloseDelimited:
    case BodyFraming::kNoBody:
      break;
  }
  if (close) head.append("Connection: close\r\n");
  head.append("\r\n");
  return head;
}

std::string render_chunk(std::string_view data) {
  if (data.empty()) return {};
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string chunk(size);
  chunk.append(data).append("\r\n");
  return chunk;
}

bool asks_to_close(const HeaderFields& headers) {
  for (const auto& [name, value] : headers) {
    if (!ascii_iequals(name, "Connection")) continue;
    std::string_view rest = value;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      if (ascii_iequals(trim_ows(rest.substr(0, comma)), "close")) return true;
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  return false;
}

std::string_view reason_phrase(int status) {
  for (const auto& [code, reason] : kReasons) {
    if (code == status) return reason;
  }
  return "Unknown";
}

}  // namespace flux2::server::http
