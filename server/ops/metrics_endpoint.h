// /metrics over HTTP (prometheus-cpp's Exposer) on its own address, optionally behind HTTP basic
// auth (Prometheus' basic_auth scrape setting). Tested by tests/server/metrics_test.cc.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "prometheus/exposer.h"
#include "server/ops/metrics.h"

namespace flux2::server {

class MetricsEndpoint {
 public:
  // Serves `metrics` on `address` ("host:port"; port 0: any free one); `user` empty: no auth.
  // Unavailable naming --metrics-port when it cannot.
  absl::Status start(const std::string& address, Metrics& metrics, const std::string& user,
                     const std::string& password);
  int port() const { return port_; }
  void stop() { exposer_.reset(); }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string user_, password_;
  int port_ = 0;
};

}  // namespace flux2::server
