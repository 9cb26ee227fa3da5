// peer_process: who is at the other end of a client connection, and
// whether that process holds a shared-memory object itself. Linux /proc
// only; every function answers "unknown" (nullopt / 0) where /proc does not
// tell (another PID namespace, another user's /proc/<pid> without
// CAP_SYS_PTRACE, no such file), never a guess.
//
// The registry uses it for proof of possession (gpu/shm_policy.hpp): a
// client may register a /dev/shm object only if its own process has it open
// or mapped, so the sidecar never becomes the deputy that reads or writes
// memory the client could not reach itself. The engine bridge uses
// tcp_peer_connected() to see that a gRPC client's connection ended (gRPC
// servers get no event for it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvs {

/// A TCP endpoint as the kernel's tables show it.
struct tcp_endpoint {
  std::string ip; ///< numeric, as inet_pton reads it ("127.0.0.1", "::1")
  uint16_t port = 0;
};

/// gRPC's name of a peer ("ipv4:127.0.0.1:40123", "ipv6:[::1]:40123", the
/// brackets possibly %-escaped), or nullopt for any other kind (unix:).
std::optional<tcp_endpoint> parse_grpc_peer(std::string_view peer);

/// Whether a connection of this process's network namespace has `peer` as
/// its remote end and is ESTABLISHED (/proc/net/tcp, tcp6); nullopt when
/// `peer` is no TCP endpoint or the tables cannot be read.
std::optional<bool> tcp_peer_connected(std::string_view grpc_peer);
std::optional<bool> tcp_remote_established(const tcp_endpoint& remote);

/// The socket whose local end is `local` (the client's side of a loopback
/// connection): its owner's uid and its inode.
struct tcp_socket_owner {
  uint32_t uid = 0;
  uint64_t inode = 0;
};
std::optional<tcp_socket_owner> tcp_local_socket(const tcp_endpoint& local);

/// The process (in this PID namespace) with socket `inode` among its open
/// descriptors, 0 when none is visible.
int32_t pid_of_socket(uint64_t inode);

/// Whether process `pid` has the POSIX shared-memory object `name` ("/x" or
/// "x") open (/proc/<pid>/fd) or mapped (/proc/<pid>/maps); nullopt when
/// neither can be read.
std::optional<bool> process_holds_shm(int32_t pid, std::string_view name);

} // namespace kvs
