// `flux2_server --probe liveness|readiness --addr HOST:PORT`: one grpc.health.v1 Check within 2 s
// for container HEALTHCHECKs. Tested by tests/server/e2e_test.cc (ProbeMode).
#pragma once

#include <string>

namespace flux2::server {

// What to check: the health service ("liveness" or "readiness") of the server at `address`
// (HOST:PORT), over TLS when `tls_cert_file` (the server's --tls-cert) is set.
struct HealthProbe {
  std::string service;
  std::string address;
  std::string tls_cert_file;
};

// Returns the process exit code: 0 when the service is SERVING, 1 otherwise (message on stderr).
int run_health_probe(const HealthProbe& probe);

}  // namespace flux2::server
