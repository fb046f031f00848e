// flux2_server: the FLUX.2 gRPC service (flags: `flux2_server --help`). Parses flags, serves until
// SIGTERM/SIGINT, then drains for at most --drain-timeout-s and exits 0; exits 1 when the model
// fails to load; `--probe` runs a health check instead. Tested by tests/server/e2e_test.cc.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/base/fast_path_registry.h"
#include "server/app/server.h"
#include "server/app/server_options.h"
#include "server/common/log.h"
#include "server/grpc/probe.h"

namespace {

using flux2::server::Clock;
using flux2::server::log_line;
using flux2::server::LogFormat;
using flux2::server::LogLevel;
using flux2::server::set_log_format;

// Written by the signal handler, read by the signal thread (the self-pipe pattern): a handler
// rather than a blocked mask, because libraries (OpenBLAS) start threads before main() that would
// otherwise receive SIGTERM with its default action and kill the process mid-drain.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  const int saved_errno = errno;
  [[maybe_unused]] ssize_t written = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

bool install_stop_signal_handlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return false;
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  return sigaction(SIGTERM, &action, nullptr) == 0 && sigaction(SIGINT, &action, nullptr) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<flux2::server::ParsedFlags> parsed = flux2::server::parse_server_flags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "flux2_server: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(flux2::server::server_help_text().c_str(), stdout);
    return 0;
  }
  if (parsed->version) {
    std::printf("flux2_server %s\n", flux2::server::server_version().c_str());
    return 0;
  }
  const flux2::server::ServerOptions& options = parsed->options;
  set_log_format(options.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  if (absl::Status valid = flux2::server::validate_server_options(options); !valid.ok()) {
    std::fprintf(stderr, "flux2_server: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  if (!options.probe.empty()) {
    return flux2::server::run_health_probe({options.probe, options.probe_addr, options.tls_cert});
  }

  if (!install_stop_signal_handlers()) {
    log_line(LogLevel::kError, "cannot install the SIGTERM/SIGINT handlers");
    return 1;
  }
  absl::StatusOr<std::unique_ptr<flux2::server::Server>> server =
      flux2::server::Server::Create(options);
  if (!server.ok()) {
    log_line(LogLevel::kError, server.status().message());
    return 2;
  }
  if (absl::Status started = (*server)->Start(); !started.ok()) {
    log_line(LogLevel::kError, started.message());
    return 1;
  }
  // Tests and scripts read the bound ports from this line (useful with --port 0).
  std::printf("flux2_server: listening grpc=%d metrics=%d http=%d\n", (*server)->grpc_port(),
              (*server)->metrics_port(), (*server)->http_port());
  std::fflush(stdout);

  flux2::server::Server* raw = server->get();
  std::thread signal_thread([raw] {
    unsigned char signal = 0;
    while (read(g_signal_pipe[0], &signal, 1) != 1) {
      if (errno != EINTR) return;
    }
    log_line(LogLevel::kInfo,
             signal == SIGTERM ? "received SIGTERM; draining" : "received SIGINT; draining");
    raw->RequestStop();
  });
  signal_thread.detach();  // a later signal is ignored; the drain is bounded by --drain-timeout-s

  const absl::Status load = (*server)->WaitForStopRequest();  // a fatal error, or OK
  const auto drain = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.drain_timeout_s));
  const absl::Status drained = (*server)->GracefulStop(Clock::now() + drain);
  if (!drained.ok()) log_line(LogLevel::kWarning, drained.message());
  const int code = load.ok() ? 0 : 1;
  if (!load.ok()) {
    // The last line a user reads: why nothing was (or is no longer) served, e.g. a memory plan
    // larger than the device, with the plan and the flag that shrinks it, or a broken GPU.
    log_line(LogLevel::kError, absl::StrCat("exiting: ", load.message()));
  }
  // A worker still loading weights cannot be joined; a broken device's state (CUDA context,
  // library handles) cannot be torn down reliably: exit without the destructors.
  if (!(*server)->worker_joined() || (*server)->device_broken()) {
    std::fflush(nullptr);
    std::_Exit(code);
  }
  server->reset();
  return code;
}
