// admin_api: the backend of LMCache's HTTP control plane
// (admin/admin_routes.hpp): answers each call from the health atomics,
// the effective config, and the store actor, which it asks with a
// deadline (admin_store_timeout) and a fresh scoped actor per call, as the
// /metrics collector does, so a late answer is never taken for another
// call's. Runs on the HTTP server's admin thread; no actor state is
// touched here.
#pragma once

#include "actors/interfaces.hpp"
#include "config/config.hpp"
#include "admin/admin_routes.hpp"

#include <caf/actor_system.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvs {

/// How long a control-plane call waits for the store (then 504).
inline constexpr std::chrono::milliseconds admin_store_timeout{2000};
/// Prefetches (POST /cache/prefetches) in flight at most (then 503), and
/// finished ones kept for their status poll (the oldest dropped past it).
inline constexpr size_t admin_max_prefetches = 64;
inline constexpr size_t admin_kept_prefetches = 1024;
/// POST /cache/checksums hashes at most this many chunk bytes (then 413;
/// MD5 here runs ~330 MiB/s, so under a second):
/// the http-admin thread does it, and LMCache's /healthcheck waits behind it
/// (/healthz and /readyz do not).
inline constexpr uint64_t admin_checksum_max_bytes = 256ull << 20;

class admin_api : public admin_backend {
public:
  admin_api(caf::actor_system& sys, const config& cfg) : sys_(sys), cfg_(cfg) {}

  /// The store (null: the cache server is off), the L2 actor (null: no
  /// L2 tier) and the gpu-transfer actor (block-id checksums) to ask from now on.
  void watch(store_actor store, l2_actor l2 = {}, gpu_transfer_actor gpu = {});

  http_answer serve(const admin_call& call) override;

  /// The policy of `cfg`: loopback from http.listen, the token from
  /// http.admin_token or else $KVSIDECAR_ADMIN_TOKEN.
  static admin_policy policy_of(const config& cfg);

private:
  store_actor current_store();
  /// 503: why there is no store to ask.
  http_answer store_missing() const;
  /// The store's reply, or the answer that says why there is none.
  std::variant<store_admin_reply, http_answer> ask(store_admin q);
  http_answer status();
  http_answer answer(const admin_req::root&);
  http_answer answer(const admin_req::healthcheck&);
  http_answer answer(const admin_req::config_adapters&);
  /// GET|PUT|DELETE /quota[/{salt}]: `what` is the store's quota op.
  http_answer quota(store_admin::op what, const std::string& salt, uint64_t limit_bytes,
                    double limit_gb);
  /// The chunk hashes of a call's tokens under its model, world size and salt.
  std::vector<uint64_t> hashes_of(const admin_req::token_chunks& call) const;
  /// POST /cache/clear: L1 through the store, L2's node-local tier through
  /// the L2 actor, by the call's tier ("l1", "l2", "all").
  http_answer clear(const admin_req::cache_clear& call);
  http_answer prefetch(const admin_req::prefetch_submit& call);
  http_answer prefetch_status(const admin_req::prefetch_status& call);
  /// GET|DELETE /cache/objects: L2 (tier l2, LMCache's default) through
  /// the L2 actor, L1 (tier l1) through the store; "all" deletes from both.
  http_answer objects_list(const admin_req::objects_list& call);
  http_answer objects_delete(const admin_req::objects_delete& call);
  l2_actor current_l2();
  http_answer l2_objects_list(const admin_req::objects_list& call);
  std::variant<l2_deleted, http_answer> l2_objects_delete(const admin_req::objects_delete& call);
  /// POST /cache/checksums by token ids: MD5 of each L1 chunk, read-locked.
  http_answer checksums(const admin_req::chunk_checksums& call);
  /// LMCache's block-id form: the engine's KV blocks, a chunk at a time
  /// from the gpu-transfer actor, hashed here.
  http_answer block_checksums(const admin_req::block_checksums& call);

  /// Prefetch jobs; shared with the actors that run them, which may finish
  /// after this object is gone.
  struct prefetch_jobs {
    struct job {
      bool done = false;
      uint64_t found = 0, total = 0;
      std::string error;
    };
    std::mutex mu;
    std::map<std::string, job> jobs;
    std::deque<std::string> finished; ///< oldest first
    size_t running = 0;
    uint64_t next = 1;
  };
  std::shared_ptr<prefetch_jobs> jobs_ = std::make_shared<prefetch_jobs>();

  caf::actor_system& sys_;
  const config& cfg_;
  std::mutex mu_;
  store_actor store_;
  l2_actor l2_;
  gpu_transfer_actor gpu_;
};

} // namespace kvs
