#include "actors/cache/peer_connections.hpp"

namespace kvs {

std::optional<std::string> peer_connections::bind(int fd, const std::string& identity) {
  auto [it, fresh] = by_fd_.try_emplace(fd, identity);
  if (fresh || it->second == identity)
    return std::nullopt;
  std::optional<std::string> before = std::move(it->second);
  it->second = identity;
  return before;
}

std::optional<std::string> peer_connections::disconnected(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end())
    return std::nullopt;
  std::optional<std::string> gone = std::move(it->second);
  by_fd_.erase(it);
  return gone;
}

} // namespace kvs
