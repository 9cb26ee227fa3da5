// A small Redis / Redis Cluster client for the L2 tier, over Debian's
// hiredis (libhiredis-dev, 0.14 in bookworm).
//
// What hiredis does: the connection (connect with timeout, socket
// timeouts), AUTH, CLUSTER SLOTS and command() (its encoder and reply
// parser). The pipelined GET/SET/EXISTS requests and their replies go
// through l2/resp_wire instead: values are sent from the caller's memory and
// a GET's bulk is read straight into the returned string (hiredis copies
// each value twice either way; see resp_wire.hpp).
// What is written here, because hiredis 0.14 has no cluster support and
// hiredis-cluster is not packaged in Debian (`apt-cache search hiredis`):
//   - the cluster's key -> slot map: CRC16/XMODEM of the key (or of its
//     {hash tag}) mod 16384, filled from CLUSTER SLOTS of any reachable node;
//   - MOVED (refresh the map, retry at the new owner) and ASK (ASKING + retry
//     at the importing node, map unchanged) redirects;
//   - pipelining across nodes: a batch is grouped by owning node and
//     connection, every command is written before any reply is read;
//   - reconnect: a connection that failed is dropped; the next batch
//     reconnects (after `retry_after`, so a dead node costs one timeout, not
//     one per batch) and, in a cluster, refreshes the slot map first;
//   - AUTH after every connect.
// Every failure is a miss (GET/EXISTS) or a skipped write (SET), counted in
// stats(); nothing throws. A server that answers garbage, announces a value
// over `max_value_bytes`, closes mid-reply or stops answering costs one
// timeout at most: its connection is dropped and last_error() says what
// was wrong ("127.0.0.1:6379: read: bulk length ... over the limit ...").
//
// Single-threaded (the L2 actor owns it).
#pragma once

#include "l2/resp_wire.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct redisContext;

namespace kvs {

/// CRC16 (XMODEM) of the key's hash-tag part, mod 16384, as Redis Cluster.
uint16_t redis_key_slot(std::string_view key);

struct redis_options {
  std::vector<std::string> endpoints; ///< "host:port"; one of a cluster is enough
  bool cluster = false;
  std::string password;               ///< AUTH after connect (empty: none)
  std::chrono::milliseconds ttl{0};   ///< SET ... PX ttl (0: no expiry)
  int connections = 1;                ///< per node; a batch is spread over them
  std::chrono::milliseconds timeout{1000};    ///< connect and per-reply
  std::chrono::milliseconds retry_after{1000}; ///< a failed node is skipped this long
  /// A GET reply announcing a longer value is a protocol error (the
  /// connection is dropped, the key is a miss); Redis's own default
  /// proto-max-bulk-len.
  size_t max_value_bytes = size_t{512} << 20;
};

struct redis_stats {
  uint64_t gets = 0, get_hits = 0, sets = 0, set_ok = 0, exists = 0;
  uint64_t errors = 0;       ///< error replies and I/O failures (a key each)
  uint64_t connects = 0;     ///< successful (re)connections
  uint64_t connect_failures = 0;
  uint64_t moved = 0, asked = 0;
  uint64_t slot_refreshes = 0;
  uint64_t unreachable = 0;  ///< keys skipped: their node is down or unknown
};

class redis_client {
public:
  explicit redis_client(redis_options opts);
  ~redis_client();
  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;

  /// One pipelined round (per node) of GETs: values, nullopt for a miss or
  /// any failure.
  std::vector<std::optional<std::string>> get(const std::vector<std::string>& keys);
  /// The same GETs, each value read into values[i] (resized to keys.size());
  /// true where it is a hit, and values[i] is empty where not. A string
  /// already there is overwritten in place: a caller that keeps `values`
  /// between batches allocates (and page-faults) nothing.
  std::vector<bool> get_into(const std::vector<std::string>& keys,
                             std::vector<std::string>& values);
  /// EXISTS per key: false for a miss or any failure.
  std::vector<bool> exists(const std::vector<std::string>& keys);
  /// SET key value [PX ttl] per pair: true when the server said OK. The
  /// values are sent from the caller's memory; heads[i], when given, goes
  /// out just before values[i] as part of the same value (a header that is
  /// not stored next to its payload).
  std::vector<bool> set(const std::vector<std::string>& keys,
                        const std::vector<std::string_view>& values,
                        const std::vector<std::string_view>& heads = {});

  /// A plain command on the node owning `key` (tests, diagnostics); the
  /// reply flattened to text, or error kind "unreachable" (no node or no
  /// connection) or "io" (the command failed), the detail saying why.
  expected<std::string> command(const std::vector<std::string>& argv, std::string_view key = {});

  const redis_stats& stats() const { return stats_; }
  /// Nodes known (cluster: from the slot map; else the endpoints).
  size_t node_count() const;
  /// The last connection / cluster error, for a log line.
  const std::string& last_error() const { return last_error_; }

private:
  struct node;
  struct op;
  void run(std::vector<op>& ops);
  node* node_for(std::string_view key);
  node* node_at(const std::string& endpoint);
  redisContext* connection(node& n, size_t i);
  void refresh_slots();
  void fail_node(node& n, const std::string& why);

  redis_options opts_;
  std::vector<std::unique_ptr<node>> nodes_;
  std::vector<int32_t> slots_; ///< slot -> index into nodes_ (-1: unknown)
  bool slots_stale_ = true;
  std::chrono::steady_clock::time_point last_refresh_{};
  redis_stats stats_;
  std::string last_error_;
  resp_writer writer_; ///< reused by every lane of every batch
  resp_reader reader_; ///< idem; empty between lanes
};

} // namespace kvs
