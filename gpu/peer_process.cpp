#include "gpu/peer_process.hpp"

#include "gpu/shm_policy.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace kvs {

namespace {

/// An address as /proc/net/tcp{,6} prints it: the 32-bit words of the
/// address in host byte order, "%08X" each; the port "%04X".
struct proc_address {
  std::string v4;     ///< 8 hex digits, "" when not IPv4
  std::string v6;     ///< 32 hex digits (an IPv4 address: its ::ffff: mapping)
  std::string port;   ///< 4 hex digits
};

std::string words_hex(const unsigned char* bytes, size_t n) {
  std::string out;
  char buf[9];
  for (size_t i = 0; i < n; i += 4) {
    uint32_t w;
    std::memcpy(&w, bytes + i, 4);
    std::snprintf(buf, sizeof buf, "%08X", w);
    out += buf;
  }
  return out;
}

std::optional<proc_address> to_proc(const tcp_endpoint& e) {
  proc_address a;
  char port[5];
  std::snprintf(port, sizeof port, "%04X", e.port);
  a.port = port;
  unsigned char v4[4];
  std::array<unsigned char, 16> v6{};
  if (inet_pton(AF_INET, e.ip.c_str(), v4) == 1) {
    a.v4 = words_hex(v4, 4);
    v6[10] = v6[11] = 0xff;
    std::memcpy(v6.data() + 12, v4, 4);
    a.v6 = words_hex(v6.data(), 16);
    return a;
  }
  if (inet_pton(AF_INET6, e.ip.c_str(), v6.data()) == 1) {
    a.v6 = words_hex(v6.data(), 16);
    return a;
  }
  return std::nullopt;
}

/// One row of /proc/net/tcp{,6}: what the callers need of it.
struct tcp_row {
  std::string local, remote; ///< "ADDR:PORT" as printed
  int state = 0;
  uint32_t uid = 0;
  uint64_t inode = 0;
};

/// Calls `f(row)` for every row of both tables until it returns true;
/// false when neither table could be read.
template <class F>
bool each_tcp_row(F&& f) {
  bool any = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in{path};
    if (!in)
      continue;
    any = true;
    std::string line;
    std::getline(in, line); // the header
    while (std::getline(in, line)) {
      char local[64], remote[64];
      unsigned state = 0, uid = 0;
      unsigned long long inode = 0;
      // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
      if (std::sscanf(line.c_str(), " %*u: %63s %63s %x %*x:%*x %*x:%*x %*x %u %*d %llu", local,
                      remote, &state, &uid, &inode)
          != 5)
        continue;
      tcp_row r{local, remote, static_cast<int>(state), uid, inode};
      if (f(r))
        return true;
    }
  }
  return any;
}

bool same(const std::string& printed, const proc_address& a) {
  auto colon = printed.find(':');
  if (colon == std::string::npos || printed.compare(colon + 1, std::string::npos, a.port) != 0)
    return false;
  auto addr = std::string_view{printed}.substr(0, colon);
  return (!a.v4.empty() && addr == a.v4) || addr == a.v6;
}

constexpr int tcp_established = 1;

} // namespace

std::optional<tcp_endpoint> parse_grpc_peer(std::string_view peer) {
  std::string p;
  // gRPC may %-escape the brackets of an IPv6 address.
  for (size_t i = 0; i < peer.size(); ++i) {
    if (peer[i] == '%' && i + 2 < peer.size()) {
      auto hexv = std::string{peer.substr(i + 1, 2)};
      p += static_cast<char>(std::strtol(hexv.c_str(), nullptr, 16));
      i += 2;
    } else {
      p += peer[i];
    }
  }
  std::string_view v{p};
  bool six = false;
  if (v.rfind("ipv4:", 0) == 0) {
    v.remove_prefix(5);
  } else if (v.rfind("ipv6:", 0) == 0) {
    v.remove_prefix(5);
    six = true;
  } else {
    return std::nullopt;
  }
  auto colon = v.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= v.size())
    return std::nullopt;
  auto host = v.substr(0, colon);
  if (six) {
    if (host.size() < 2 || host.front() != '[' || host.back() != ']')
      return std::nullopt;
    host = host.substr(1, host.size() - 2);
  }
  auto port_s = std::string{v.substr(colon + 1)};
  if (port_s.find_first_not_of("0123456789") != std::string::npos || port_s.size() > 5)
    return std::nullopt;
  auto port = std::strtoul(port_s.c_str(), nullptr, 10);
  if (port == 0 || port > 65535)
    return std::nullopt;
  return tcp_endpoint{std::string{host}, static_cast<uint16_t>(port)};
}

std::optional<bool> tcp_remote_established(const tcp_endpoint& remote) {
  auto a = to_proc(remote);
  if (!a)
    return std::nullopt;
  bool found = false;
  if (!each_tcp_row([&](const tcp_row& r) {
        found = r.state == tcp_established && same(r.remote, *a);
        return found;
      }))
    return std::nullopt;
  return found;
}

std::optional<bool> tcp_peer_connected(std::string_view grpc_peer) {
  auto e = parse_grpc_peer(grpc_peer);
  if (!e)
    return std::nullopt;
  return tcp_remote_established(*e);
}

std::optional<tcp_socket_owner> tcp_local_socket(const tcp_endpoint& local) {
  auto a = to_proc(local);
  if (!a)
    return std::nullopt;
  std::optional<tcp_socket_owner> out;
  each_tcp_row([&](const tcp_row& r) {
    if (r.state != tcp_established || !same(r.local, *a))
      return false;
    out = tcp_socket_owner{r.uid, r.inode};
    return true;
  });
  return out;
}

int32_t pid_of_socket(uint64_t inode) {
  if (inode == 0)
    return 0;
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  DIR* proc = opendir("/proc");
  if (!proc)
    return 0;
  int32_t found = 0;
  char link[256];
  while (auto* d = readdir(proc)) {
    const char* name = d->d_name;
    if (*name < '1' || *name > '9')
      continue;
    const std::string fd_dir = std::string{"/proc/"} + name + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (!fds)
      continue; // gone, or not ours to read
    while (auto* f = readdir(fds)) {
      if (f->d_name[0] == '.')
        continue;
      const auto path = fd_dir + "/" + f->d_name;
      auto n = readlink(path.c_str(), link, sizeof link - 1);
      if (n > 0 && static_cast<size_t>(n) == want.size() && want.compare(0, want.size(), link, n) == 0) {
        found = static_cast<int32_t>(std::strtol(name, nullptr, 10));
        break;
      }
    }
    closedir(fds);
    if (found)
      break;
  }
  closedir(proc);
  return found;
}

std::optional<bool> process_holds_shm(int32_t pid, std::string_view name) {
  if (pid <= 0)
    return std::nullopt;
  const std::string path = "/dev/shm/" + std::string{shm_bare_name(name)};
  const std::string base = "/proc/" + std::to_string(pid);
  bool readable = false;
  if (DIR* fds = opendir((base + "/fd").c_str())) {
    readable = true;
    char link[4096];
    bool held = false;
    while (auto* f = readdir(fds)) {
      if (f->d_name[0] == '.')
        continue;
      auto n = readlink((base + "/fd/" + f->d_name).c_str(), link, sizeof link - 1);
      if (n > 0 && std::string_view{link, static_cast<size_t>(n)} == path) {
        held = true;
        break;
      }
    }
    closedir(fds);
    if (held)
      return true;
  }
  // Mapped without a descriptor (closed after mmap, as torch does): the
  // mapping's path ends its line in /proc/<pid>/maps.
  std::ifstream maps{base + "/maps"};
  if (maps) {
    std::string line;
    bool any = false;
    while (std::getline(maps, line)) {
      any = true;
      if (line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0
          && (line.size() == path.size() || line[line.size() - path.size() - 1] == ' '))
        return true;
    }
    // An empty read means we may not see it (another user's process).
    readable = readable || any;
  }
  if (!readable)
    return std::nullopt;
  return false;
}

} // namespace kvs
