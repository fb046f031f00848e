// Finding and polling an HTTP request's socket; see http_connection.h.
// Tested by tests/server/http_api_test.cc.
#include "server/http/http_connection.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace flux2::server {
namespace {

// The numeric host and port of a socket address, as cpp-httplib reports them (getnameinfo with
// NI_NUMERICHOST).
bool numeric_address(const sockaddr_storage& address, socklen_t length, std::string* host,
                     int* port) {
  char name[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, name, sizeof(name), nullptr,
                  0, NI_NUMERICHOST) != 0) {
    return false;
  }
  *host = name;
  if (address.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  } else if (address.ss_family == AF_INET6) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  } else {
    return false;
  }
  return true;
}

bool socket_matches(int fd, const std::string& local_addr, int local_port,
                    const std::string& remote_addr, int remote_port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  std::string host;
  int port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  if (!numeric_address(address, length, &host, &port) || port != remote_port ||
      host != remote_addr) {
    return false;
  }
  length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  return numeric_address(address, length, &host, &port) && port == local_port && host == local_addr;
}

}  // namespace

// Calls visit(fd) for each socket descriptor of this process until it returns true.
template <typename Visit>
void for_each_socket(Visit visit) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);  // NOLINT(runtime/int)
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat info {};
    if (fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    if (visit(static_cast<int>(fd))) break;
  }
  closedir(dir);
}

int find_connection_socket(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port) {
  int found = -1;
  for_each_socket([&](int fd) {
    if (!socket_matches(fd, local_addr, local_port, remote_addr, remote_port)) return false;
    found = fd;
    return true;
  });
  return found;
}

int shut_down_connections(int local_port) {
  int count = 0;
  for_each_socket([&](int fd) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    std::string host;
    int port = 0;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
    length = sizeof(address);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
    if (numeric_address(address, length, &host, &port) && port == local_port) {
      shutdown(fd, SHUT_RDWR);
      ++count;
    }
    return false;
  });
  return count;
}

bool peer_hung_up(int fd) {
  if (fd < 0) return false;
  pollfd entry{fd, POLLRDHUP, 0};
  if (poll(&entry, 1, 0) <= 0) return false;
  return (entry.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace flux2::server
