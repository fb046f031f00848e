// `flux2_server --probe liveness|readiness --addr HOST:PORT`: one grpc.health.v1 Check within 2 s
// for container HEALTHCHECKs. Tested by tests/server/e2e_test.cc (ProbeMode).
#pragma once

#include "server/server_options.h"

namespace flux2::server {

// Returns the process exit code: 0 when the service is SERVING, 1 otherwise (message on stderr).
int run_health_probe(const ServerOptions& options);

}  // namespace flux2::server
