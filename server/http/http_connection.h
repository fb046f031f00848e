// Watching the client of an HTTP request for a hang-up while its generation runs. cpp-httplib
// hands a handler the request's addresses but not its socket, and a blocked handler never reads
// from it, so the socket is found once per generation request among the process's descriptors by
// its local and peer address, then polled (POLLRDHUP) between waits: a closed connection cancels
// the job within one denoising step. Linux only (/proc/self/fd). Tested by the HTTP API tests
// (tests/server/http_api_test.cc: a client that hangs up cancels its request; an idle keep-alive
// connection does not hold up the drain).
#pragma once

#include <string>

namespace flux2::server {

// The descriptor of the connected TCP socket whose local end is local_addr:local_port and whose
// peer is remote_addr:remote_port (numeric hosts as getnameinfo prints them); -1 when none is
// found (then hang-ups are not noticed: the request runs to its end or its deadline).
int find_connection_socket(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port);

// Shuts down (both directions) every connected TCP socket of this process whose local port is
// `local_port`: at drain, idle keep-alive connections end at once instead of after their timeout.
// Returns how many.
int shut_down_connections(int local_port);

// True when the peer of `fd` closed its side or the connection failed (POLLRDHUP, POLLHUP,
// POLLERR); false for -1 and while the connection is open. Does not block.
bool peer_hung_up(int fd);

}  // namespace flux2::server
