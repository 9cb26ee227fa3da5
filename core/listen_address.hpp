// listen_address: "a.b.c.d:port" or "[v6]:port" parsed into the socket
// address to bind. One parser for the config check (http.listen) and the
// HTTP server that binds it.
#pragma once

#include "core/error.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace kvs {

struct listen_address {
  sockaddr_storage addr{};
  socklen_t len = 0;
  bool v6 = false;
};

/// An IPv4 address or an IPv6 address in brackets, a colon, a port in
/// 1..65535 (addresses, not names: the server binds them). The error
/// (kind "bad_value") says what was expected.
inline expected<listen_address> parse_listen_address(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= s.size())
    return make_error("bad_value", "host:port");
  auto host = s.substr(0, colon);
  auto port = s.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return make_error("bad_value", "a numeric port");
  auto p = std::atol(port.c_str());
  if (p < 1 || p > 65535)
    return make_error("bad_value", "a port in 1..65535");
  listen_address a;
  a.v6 = host.front() == '[';
  if (a.v6) {
    // "[::]:9090" (IPv6 and IPv4 clients) or another IPv6 address.
    auto& a6 = reinterpret_cast<sockaddr_in6&>(a.addr);
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons(static_cast<uint16_t>(p));
    if (host.size() < 3 || host.back() != ']'
        || ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6.sin6_addr) != 1)
      return make_error("bad_value",
                        "an IPv4 address or an IPv6 address in brackets like \"[::]:9090\"");
    a.len = sizeof(a6);
  } else {
    auto& a4 = reinterpret_cast<sockaddr_in&>(a.addr);
    a4.sin_family = AF_INET;
    a4.sin_port = htons(static_cast<uint16_t>(p));
    // Dotted IPv4, four parts of 0..255.
    if (::inet_pton(AF_INET, host.c_str(), &a4.sin_addr) != 1)
      return make_error("bad_value", "an IPv4 address");
    a.len = sizeof(a4);
  }
  return a;
}

} // namespace kvs
