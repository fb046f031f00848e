// TransportOptions: the address, TLS material, limits, timeouts and thread counts of the HTTP/1.1
// transport (transport.h). Every limit and timeout is enforced by the transport itself, each with
// a test in tests/server/http_transport_test.cc:
//   build-http/bin/http_transport_tests --gtest_filter='HttpTransport*'
#pragma once

#include <cstdint>
#include <string>

namespace flux2::server::http {

struct TransportOptions {
  std::string host = "0.0.0.0";  // an IP literal, or a name resolved once at start
  int port = 8000;               // 0: any free port (Transport::port() says which)
  std::string tls_cert_pem;      // PEM text (chain); with tls_key_pem: TLS. Both empty: plaintext
  std::string tls_key_pem;

  // Head limits. The request line longer than this gets 414, decided from the bytes received
  // (at most 65000: Beast stores the target with a 16-bit length).
  int64_t max_request_line_bytes = 8 << 10;
  // All header fields together; more -> 431. One field value longer than 65532 bytes -> 431 too
  // (Beast's limit), whatever this says.
  int64_t max_header_bytes = 64 << 10;
  int max_header_fields = 100;  // more -> 431
  // Body limit: a Content-Length above it gets 413 at the head; a chunked body when its running
  // total passes it. Never more than this is buffered.
  int64_t max_body_bytes = int64_t{48} << 20;

  double head_timeout_s = 10;   // request line + headers, from the request's first byte -> 408
  double body_timeout_s = 60;   // the whole body, from the end of the head -> 408
  double idle_timeout_s = 5;    // waiting for a request's first byte -> closed silently
  double write_timeout_s = 60;  // a response write without progress this long -> closed (on_gone)

  int max_connections = 1024;
  int max_connections_per_client = 64;  // per peer IP address
  int io_threads = 2;                   // run the sockets; never the application's handle()
  int worker_threads = 4;               // Application::handle runs here
};

}  // namespace flux2::server::http
