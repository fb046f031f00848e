// The transport tests' raw HTTP client; see http_raw_client.h.
// Used by tests/server/http_transport_test.cc.
#include "tests/server/http_raw_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace flux2::server::http::testing {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string RawResponse::header(std::string_view name) const {
  for (const auto& [field, value] : headers) {
    if (iequals(field, name)) return value;
  }
  return "";
}

bool RawResponse::has_header(std::string_view name) const {
  for (const auto& field : headers) {
    if (iequals(field.first, name)) return true;
  }
  return false;
}

RawClient::RawClient(int port, const char* source_ip) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (source_ip != nullptr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, source_ip, &local.sin_addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
      close();
      return;
    }
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) close();
}

RawClient::~RawClient() {
  close();
}

bool RawClient::send(std::string_view bytes) {
  while (!bytes.empty() && fd_ >= 0) {
    const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(sent));
  }
  return bytes.empty();
}

bool RawClient::fill(double deadline_s) {
  if (fd_ < 0 || eof_) return false;
  const double left = deadline_s - now_s();
  if (left <= 0) return false;
  pollfd entry{fd_, POLLIN, 0};
  if (poll(&entry, 1, static_cast<int>(left * 1000) + 1) <= 0) return false;
  char chunk[65536];
  const ssize_t got = ::recv(fd_, chunk, sizeof(chunk), 0);
  if (got <= 0) {
    eof_ = true;
    return false;
  }
  buffer_.append(chunk, static_cast<size_t>(got));
  received_.append(chunk, static_cast<size_t>(got));
  return true;
}

std::optional<RawResponse> RawClient::take_head() {
  const size_t end = buffer_.find("\r\n\r\n");
  if (end == std::string::npos) return std::nullopt;
  const std::string head = buffer_.substr(0, end + 2);
  buffer_.erase(0, end + 4);
  RawResponse response;
  response.status = std::atoi(head.substr(9, 3).c_str());  // "HTTP/1.1 200 OK"
  size_t line = head.find("\r\n") + 2;
  while (line < head.size()) {
    const size_t next = head.find("\r\n", line);
    const std::string field = head.substr(line, next - line);
    const size_t colon = field.find(':');
    std::string value = field.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    response.headers.emplace_back(field.substr(0, colon), value);
    line = next + 2;
  }
  return response;
}

bool RawClient::take_body(RawResponse* response, double deadline_s) {
  if (response->status == 204 || response->status == 304) return true;
  if (iequals(response->header("Transfer-Encoding"), "chunked")) {
    response->chunked = true;
    while (true) {
      size_t crlf;
      while ((crlf = buffer_.find("\r\n")) == std::string::npos) {
        if (!fill(deadline_s)) return false;
      }
      const size_t size = std::strtoul(buffer_.substr(0, crlf).c_str(), nullptr, 16);
      while (buffer_.size() < crlf + 2 + size + 2) {
        if (!fill(deadline_s)) return false;
      }
      response->body.append(buffer_, crlf + 2, size);
      buffer_.erase(0, crlf + 2 + size + 2);
      if (size == 0) return true;
    }
  }
  if (response->has_header("Content-Length")) {
    const size_t length = std::strtoul(response->header("Content-Length").c_str(), nullptr, 10);
    while (buffer_.size() < length) {
      if (!fill(deadline_s)) return false;
    }
    response->body = buffer_.substr(0, length);
    buffer_.erase(0, length);
    return true;
  }
  response->close_delimited = true;
  while (fill(deadline_s)) {
  }
  if (!eof_) return false;
  response->body = std::move(buffer_);
  buffer_.clear();
  return true;
}

std::optional<RawResponse> RawClient::read_response(double timeout_s, bool keep_interim) {
  const double deadline = now_s() + timeout_s;
  while (true) {
    // A response only partly here at the deadline stays for the next call (a loaded machine may
    // deliver the head and the body in separate reads).
    const std::string before = buffer_;
    received_.clear();
    std::optional<RawResponse> response;
    while (!(response = take_head())) {
      if (!fill(deadline)) return std::nullopt;
    }
    if (response->status >= 100 && response->status < 200) {
      ++interim_;
      if (keep_interim) return response;
      continue;
    }
    if (!take_body(&*response, deadline)) {
      buffer_ = before + received_;
      return std::nullopt;
    }
    return response;
  }
}

bool RawClient::wait_closed(double timeout_s, std::string* bytes) {
  const double deadline = now_s() + timeout_s;
  while (fill(deadline)) {
  }
  if (bytes != nullptr) bytes->append(buffer_);
  buffer_.clear();
  return eof_;
}

bool RawClient::stays_silent(double seconds) {
  const double deadline = now_s() + seconds;
  const size_t before = buffer_.size();
  while (fill(deadline)) {
  }
  return !eof_ && buffer_.size() == before;
}

void RawClient::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void RawClient::reset() {
  if (fd_ < 0) return;
  const linger abort{1, 0};
  setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
  close();
}

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace flux2::server::http::testing
