// Connection counting, limits and idle eviction; see connection_registry.h.
// Tested by tests/server/http_transport_test.cc (HttpConnectionRegistry*).
#include "server/http/transport/connection_registry.h"

#include <utility>

namespace flux2::server::http {

ConnectionRegistry::ConnectionRegistry(int max_connections, int max_connections_per_client)
    : max_connections_(max_connections), max_per_client_(max_connections_per_client) {}

ConnectionRegistry::Verdict ConnectionRegistry::admit(
    uint64_t id, const std::string& address, std::weak_ptr<RegisteredConnection> connection) {
  std::vector<std::shared_ptr<RegisteredConnection>> victims;
  Verdict verdict = Verdict::kAdmitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto count = per_address_.find(address);
    if (count != per_address_.end() && count->second >= max_per_client_ &&
        !evict_oldest_idle_locked(&address, &victims)) {
      verdict = Verdict::kTooManyFromClient;
    } else if (static_cast<int>(entries_.size()) >= max_connections_ &&
               !evict_oldest_idle_locked(nullptr, &victims)) {
      verdict = Verdict::kTooManyConnections;
    } else {
      entries_.emplace(id, Entry{address, std::move(connection), false, idle_lru_.end()});
      ++per_address_[address];
    }
  }
  for (const std::shared_ptr<RegisteredConnection>& victim : victims) victim->evict();
  return verdict;
}

void ConnectionRegistry::mark_idle(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end() || it->second.idle) return;
  it->second.idle = true;
  it->second.lru = idle_lru_.insert(idle_lru_.end(), id);
}

bool ConnectionRegistry::mark_busy(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  if (it->second.idle) {
    idle_lru_.erase(it->second.lru);
    it->second.idle = false;
  }
  return true;
}

void ConnectionRegistry::remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(id);
  if (it != entries_.end()) erase_locked(it);
}

size_t ConnectionRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

int ConnectionRegistry::count_of(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = per_address_.find(address);
  return it == per_address_.end() ? 0 : it->second;
}

std::vector<std::shared_ptr<RegisteredConnection>> ConnectionRegistry::connections() const {
  std::vector<std::shared_ptr<RegisteredConnection>> live;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, entry] : entries_) {
    if (std::shared_ptr<RegisteredConnection> connection = entry.connection.lock()) {
      live.push_back(std::move(connection));
    }
  }
  return live;
}

bool ConnectionRegistry::evict_oldest_idle_locked(
    const std::string* address, std::vector<std::shared_ptr<RegisteredConnection>>* victims) {
  for (uint64_t id : idle_lru_) {
    const auto it = entries_.find(id);
    if (address != nullptr && it->second.address != *address) continue;
    if (std::shared_ptr<RegisteredConnection> victim = it->second.connection.lock()) {
      victims->push_back(std::move(victim));
    }
    erase_locked(it);
    return true;
  }
  return false;
}

void ConnectionRegistry::erase_locked(std::unordered_map<uint64_t, Entry>::iterator it) {
  if (it->second.idle) idle_lru_.erase(it->second.lru);
  const auto count = per_address_.find(it->second.address);
  if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
  entries_.erase(it);
}

}  // namespace flux2::server::http
