// session[rid=…]: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"

#include <chrono>
#include <map>
#include <tuple>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs {

struct session_params {
  std::string request_id;
  int64_t chunk_size = 0; ///< cache.chunk_size
  /// l2.format = "lmcache": lookups and stores carry LMCache's chunk hashes
  /// (store_lookup::l2_names) to name L2 objects.
  bool l2_lmcache_names = false;
  engine_bridge_actor bridge;
  store_actor store;
  gpu_transfer_actor gpu;
};

/// A STORE or RETRIEVE between its first step and the end of its copy.
/// The request stays in `call` (shared, never copied); each step adds what
/// it learned, and the last one gives back what the job holds in the store.
struct copy_job {
  mp_call call;
  bool to_l1 = true;            ///< STORE; false: RETRIEVE
  int32_t rank = 0;
  size_t begin = 0;             ///< first chunk of the key's [start, end) range
  std::vector<uint64_t> hashes; ///< the key's chunks 0..end (prefix-chained)
  std::vector<std::string> l2_names; ///< LMCache's hashes of them (l2.format = "lmcache")
  /// STORE, once reserved: what to commit (or abort) when the copy is over.
  std::optional<store_finish> reserved;
  uint64_t read_ticket = 0;     ///< RETRIEVE, once acquired: released after the copy

  const char* what() const { return to_l1 ? "store" : "retrieve"; }
};

/// An engine-driven transfer (LMCache's prepare_* / commit_*) between its
/// prepare and its commit: the staging slots handed to the engine and what
/// they stand for in the store.
struct staged_transfer {
  int64_t instance_id = 0;
  std::vector<uint64_t> offsets; ///< staging slots, in the reply's order
  /// store: the reserved L1 slots they go to (inline: the data's chunks
  /// go to), each one's length (its group's chunk), and its chunk's
  /// position in the key's range (an inline commit_store's tensor index).
  std::vector<uint8_t*> l1;
  std::vector<uint64_t> lengths;
  std::vector<uint64_t> positions;
  /// store: each group's reservations, committed or aborted at commit_store.
  std::vector<store_finish> reserved;
  /// store: the instance's groups (one: a single-group instance); a hybrid
  /// instance's (`grouped`) inline commit_store carries every group's data.
  stage_groups groups;
  bool grouped = false;
  /// The instance writes and reads its L1 arena in place: a store's engine
  /// wrote the reserved slots themselves (commit copies nothing); a
  /// retrieve's chunks stay pinned by `tickets` until commit_retrieve.
  bool in_place = false;
  std::vector<uint64_t> tickets;
};

struct session_state {
  static inline const char* name = "session";

  using clock = std::chrono::steady_clock;

  /// A WAIT_PREFETCH_STATUS waits at most this long, whatever timeout the
  /// client sent (keeps the deadline arithmetic in range).
  static constexpr std::chrono::hours max_prefetch_wait{24};

  /// A WAIT_PREFETCH_STATUS parked until the lookup finishes or it times out.
  struct waiter {
    mp_call call;
    clock::time_point deadline;
  };

  session_params p;
  std::string label;

  // Prefetch job of the last LOOKUP: running, done (matched chunks), or none.
  bool lookup_running = false;
  std::optional<uint64_t> matched; ///< until a status query consumes it
  std::optional<uint64_t> hits;    ///< kept for query_prefetch_lookup_hits
  uint64_t lookup_generation = 0;  ///< a newer LOOKUP supersedes older answers
  std::vector<waiter> waiters;

  /// Copies not yet over, by job id: the session outlives them.
  std::unordered_map<uint64_t, copy_job> jobs;
  uint64_t next_job = 1;
  bool ending = false;
  std::optional<mp_call> end_call; ///< END_SESSION to answer once released

  /// Engine-driven transfers awaiting their commit, by (instance, key start,
  /// key end, store?): LMCache's pending_writes / pending_reads.
  using staged_key = std::tuple<int64_t, int64_t, int64_t, bool>;
  std::map<staged_key, staged_transfer> staged;
  /// Prepares whose store/transfer answers are still out (the session waits
  /// for them before it ends, like copy jobs).
  size_t preparing = 0;
};

session_actor::behavior_type session(session_actor::stateful_pointer<session_state> self,
                                     session_params params);

} // namespace kvs
