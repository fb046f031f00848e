// ConnectionRegistry: the transport's live connections, counted in all and per client IP, with the
// idle ones (waiting for a request, nothing buffered) in least-recently-idle order. A new
// connection beyond a limit evicts the scope's oldest idle connection, or is refused (503). No
// sockets: tested by tests/server/http_transport_test.cc (HttpConnectionRegistry*, and over
// loopback in HttpTransport.*Evict*).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace flux2::server::http {

// What the registry asks of a connection; each call only queues work on the connection's strand.
class RegisteredConnection {
 public:
  virtual ~RegisteredConnection() = default;
  virtual void evict() = 0;        // the registry dropped it to admit another: close now
  virtual void begin_drain() = 0;  // the transport drains: close now if idle
  virtual void force_close() = 0;  // the transport stops: close now (an exchange left is gone)
  // The I/O threads have stopped (the end of Transport::stop): give up the exchange in flight, if
  // any (gone), on the caller's thread.
  virtual void abandon() = 0;
};

class ConnectionRegistry {
 public:
  enum class Verdict {
    kAdmitted,            // registered (possibly after evicting an idle connection)
    kTooManyConnections,  // max_connections reached and none of them idle
    kTooManyFromClient,   // max_connections_per_client reached for its address, none idle
  };

  ConnectionRegistry(int max_connections, int max_connections_per_client);

  // Registers connection `id` from IP `address` (it starts busy). When a limit is reached, the
  // least recently idle connection of that scope (the client's, or all) is removed and its evict()
  // called (after the registry's lock is released).
  Verdict admit(uint64_t id, const std::string& address,
                std::weak_ptr<RegisteredConnection> connection);
  // The connection waits for its next request with nothing buffered: it may be evicted.
  void mark_idle(uint64_t id);
  // A request's first bytes arrived. False when the connection was evicted (or removed)
  // meanwhile: then it must close, since its slot went to another.
  bool mark_busy(uint64_t id);
  void remove(uint64_t id);

  size_t size() const;
  int count_of(const std::string& address) const;
  // The live connections, to call begin_drain() or force_close() on (outside the lock).
  std::vector<std::shared_ptr<RegisteredConnection>> connections() const;

 private:
  struct Entry {
    std::string address;
    std::weak_ptr<RegisteredConnection> connection;
    bool idle = false;
    std::list<uint64_t>::iterator lru;  // into idle_lru_ while idle
  };

  // Removes the least recently idle connection (of `address` when not null) and returns whether
  // one was; *victim is set to it unless it is already destroyed. Needs mu_ held.
  bool evict_oldest_idle_locked(const std::string* address,
                                std::vector<std::shared_ptr<RegisteredConnection>>* victims);
  void erase_locked(std::unordered_map<uint64_t, Entry>::iterator it);

  const int max_connections_;
  const int max_per_client_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;       // guarded by mu_
  std::unordered_map<std::string, int> per_address_;  // guarded by mu_
  std::list<uint64_t> idle_lru_;                      // guarded by mu_; front: idle the longest
};

}  // namespace flux2::server::http
