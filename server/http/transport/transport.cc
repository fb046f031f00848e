// Transport: start (options, TLS, bind, threads), drain and stop; see transport.h.
// Tested by tests/server/http_transport_test.cc.
#include "server/http/transport/transport.h"

#include <openssl/ssl.h>

#include <thread>
#include <utility>

#include <boost/asio/buffer.hpp>

#include "server/http/transport/listener.h"
#include "server/http/transport/transport_context.h"

namespace flux2::server::http {
namespace {

namespace asio = boost::asio;

// After stop() closes every connection, how long it waits for their strands to finish closing
// (running on_gone callbacks) before it stops the I/O threads anyway.
constexpr auto kCloseGrace = std::chrono::seconds(1);

absl::Status check_options(const TransportOptions& o) {
  auto invalid = [](const char* field, const char* rule) {
    return absl::InvalidArgumentError(std::string("TransportOptions.") + field + " " + rule);
  };
  if (o.port < 0 || o.port > 65535) return invalid("port", "must be in 0..65535");
  // Beast's parser stores the target with a 16-bit length.
  if (o.max_request_line_bytes < 16 || o.max_request_line_bytes > 65000) {
    return invalid("max_request_line_bytes", "must be 16..65000");
  }
  if (o.max_header_bytes < 16 || o.max_header_bytes > (int64_t{1} << 30)) {
    return invalid("max_header_bytes", "must be 16..2^30");
  }
  if (o.max_header_fields < 1) return invalid("max_header_fields", "must be positive");
  if (o.max_body_bytes < 0) return invalid("max_body_bytes", "must not be negative");
  if (!(o.head_timeout_s > 0) || !(o.body_timeout_s > 0) || !(o.idle_timeout_s > 0) ||
      !(o.write_timeout_s > 0)) {
    return invalid("*_timeout_s", "must be positive");
  }
  if (o.max_connections < 1 || o.max_connections_per_client < 1) {
    return invalid("max_connections*", "must be positive");
  }
  if (o.io_threads < 1 || o.worker_threads < 1) return invalid("*_threads", "must be positive");
  if (o.tls_cert_pem.empty() != o.tls_key_pem.empty()) {
    return invalid("tls_cert_pem/tls_key_pem", "must both be given (TLS) or both be empty");
  }
  return absl::OkStatus();
}

absl::Status load_tls(const TransportOptions& options, std::optional<asio::ssl::context>* tls) {
  asio::ssl::context& context = tls->emplace(asio::ssl::context::tls_server);
  // TLS 1.2 and 1.3 only.
  context.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                      asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                      asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
  boost::system::error_code error;
  context.use_certificate_chain(asio::buffer(options.tls_cert_pem), error);
  if (error) {
    return absl::InvalidArgumentError("tls_cert_pem: not a PEM certificate chain (" +
                                      error.message() + ")");
  }
  context.use_private_key(asio::buffer(options.tls_key_pem), asio::ssl::context::pem, error);
  if (error) {
    return absl::InvalidArgumentError("tls_key_pem: not a PEM private key (" + error.message() +
                                      ")");
  }
  if (SSL_CTX_check_private_key(context.native_handle()) != 1) {
    return absl::InvalidArgumentError("tls_key_pem: does not match the certificate");
  }
  return absl::OkStatus();
}

}  // namespace

Transport::Transport(Application& app) : app_(app) {}

Transport::~Transport() {
  stop(std::chrono::steady_clock::now());
}

absl::Status Transport::start(const TransportOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  if (context_) return absl::FailedPreconditionError("Transport::start called twice");
  if (absl::Status status = check_options(options); !status.ok()) return status;
  auto context = std::make_unique<TransportContext>(app_, options);
  if (!options.tls_cert_pem.empty()) {
    if (absl::Status status = load_tls(options, &context->tls); !status.ok()) return status;
  }
  context->listener = std::make_shared<Listener>(*context);
  if (absl::Status status = context->listener->open(options.host, options.port); !status.ok()) {
    return status;
  }
  port_ = context->listener->port();
  context->work.emplace(context->io.get_executor());
  for (int i = 0; i < options.io_threads; ++i) {
    context->io_threads.emplace_back([io = &context->io] { io->run(); });
  }
  context->workers.start(options.worker_threads);
  context->listener->start();
  context_ = std::move(context);
  return absl::OkStatus();
}

void Transport::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!context_ || stopped_ || context_->draining.exchange(true)) return;
  context_->listener->close();
  for (const auto& connection : context_->registry.connections()) connection->begin_drain();
}

void Transport::stop(std::chrono::steady_clock::time_point deadline) {
  drain();
  std::lock_guard<std::mutex> lock(mu_);
  if (!context_ || stopped_) return;
  stopped_ = true;
  TransportContext& context = *context_;
  context.wait_for_exchanges(deadline);
  for (const auto& connection : context.registry.connections()) connection->force_close();
  const auto grace_end = std::chrono::steady_clock::now() + kCloseGrace;
  while (context.registry.size() > 0 && std::chrono::steady_clock::now() < grace_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  context.work.reset();
  context.io.stop();
  for (std::thread& thread : context.io_threads) thread.join();
  context.io_threads.clear();
  // No I/O thread runs now: a connection that did not get to close gives up its exchange here, so
  // no answer is posted to the io_context once it is destroyed.
  for (const auto& connection : context.registry.connections()) {
    connection->abandon();
  }
  context.workers.stop();
}

}  // namespace flux2::server::http
