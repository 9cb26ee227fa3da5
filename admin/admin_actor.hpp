// admin: the backend of LMCache's HTTP control plane as an actor
// (actors/interfaces.hpp, admin_actor). The HTTP server's `http-admin` thread
// only parses a request into a call (admin/admin_routes.hpp) and asks this
// actor (admin/admin_client.hpp); the work is here: the answers from the
// health atomics and the effective config, the store / L2 / gpu-transfer
// asks (each with a deadline, admin_store_timeout), the prefetch job table,
// the L1 + L2 clear, the objects pages and MD5 of chunks.
#pragma once

#include "actors/interfaces.hpp"
#include "config/config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace kvs {

/// How long the admin actor waits for the store, L2 or gpu-transfer actor
/// (then 504).
inline constexpr std::chrono::milliseconds admin_store_timeout{2000};
/// Prefetches (POST /cache/prefetches) in flight at most (then 503), and
/// finished ones kept for their status poll (the oldest dropped past it).
inline constexpr size_t admin_max_prefetches = 64;
inline constexpr size_t admin_kept_prefetches = 1024;
/// POST /cache/checksums hashes at most this many chunk bytes (then 413;
/// MD5 here runs ~330 MiB/s, so under a second): the admin actor does it,
/// and LMCache's /healthcheck waits behind it (/healthz and /readyz do not).
inline constexpr uint64_t admin_checksum_max_bytes = 256ull << 20;
/// Spare checksum buffers unused this long go back to the system.
inline constexpr std::chrono::seconds admin_spare_idle{30};

struct admin_params {
  const config* cfg = nullptr; ///< outlives the actor (run_sidecar's)
  std::chrono::nanoseconds stats_interval{};
};

struct admin_state {
  static inline const char* name = "admin";
  admin_params p;
  std::string label;
  store_actor store;        ///< null: the cache server is off, or not started yet
  l2_actor l2;              ///< null: no L2 tier
  gpu_transfer_actor gpu;   ///< block-id checksums

  /// Prefetch jobs by request id.
  struct job {
    bool done = false;
    uint64_t found = 0, total = 0;
    std::string error;
  };
  std::map<std::string, job> jobs;
  std::deque<std::string> finished; ///< oldest first
  size_t running = 0;
  uint64_t next_job = 1;

  uint64_t calls = 0; ///< calls answered or taken on

  /// Block-id checksums: hashed chunks' buffers, handed to the next reads
  /// (gpu_checksum_read::buffer) so a chunk's 32 MiB is not faulted in
  /// afresh each time. At most admin_checksum_max_bytes; dropped by the
  /// stats tick once unused for admin_spare_idle.
  std::vector<std::vector<uint8_t>> spare_buffers;
  uint64_t spare_bytes = 0;
  std::chrono::steady_clock::time_point spare_used{};
};

using admin_self = admin_actor::stateful_pointer<admin_state>;

admin_actor::behavior_type admin(admin_self self, admin_params p);

} // namespace kvs
