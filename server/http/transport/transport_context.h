// TransportContext: what the transport's I/O threads, connections and listener share (options, the
// application, the io_context, TLS, the registry, the worker pool, the drain flag and the count of
// exchanges in flight). Internal to flux2_http_transport; tested through
// tests/server/http_transport_test.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>

#include "server/http/transport/connection_registry.h"
#include "server/http/transport/options.h"
#include "server/http/transport/worker_pool.h"

namespace flux2::server::http {

class Application;
class Listener;

struct TransportContext {
  TransportContext(Application& app, const TransportOptions& options)
      : app(app),
        options(options),
        registry(options.max_connections, options.max_connections_per_client) {}

  // An exchange was handed to the application / its response was written or it was gone.
  void exchange_admitted() {
    std::lock_guard<std::mutex> lock(mu);
    ++in_flight;
  }
  void exchange_finished() {
    std::lock_guard<std::mutex> lock(mu);
    --in_flight;
    cv.notify_all();
  }
  // True when no exchange is in flight by `deadline`.
  bool wait_for_exchanges(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_until(lock, deadline, [this] { return in_flight == 0; });
  }

  // Declaration order is destruction order reversed: the io_context (and the handlers it still
  // holds, which own connections) goes before the registry, TLS context and counters they use.
  Application& app;
  const TransportOptions options;
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0;  // guarded by mu
  std::atomic<bool> draining{false};
  std::atomic<uint64_t> next_connection_id{1};
  ConnectionRegistry registry;
  std::optional<boost::asio::ssl::context> tls;  // empty: plaintext
  WorkerPool workers;
  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::shared_ptr<Listener> listener;
  std::vector<std::thread> io_threads;
};

}  // namespace flux2::server::http
