// admin_client: the HTTP server's side of the control plane's backend
// (admin_backend, admin/admin_routes.hpp). On the `http-admin` thread it
// only hands each parsed call to the admin actor (admin/admin_actor.hpp),
// which does the work, and waits for its answer with a deadline (a fresh
// scoped actor per call, so a late answer is never taken for another
// call's). Owns the admin actor: spawns it, tells it the actor tree, ends
// it when the last holder (the plane, the sidecar) lets go.
#pragma once

#include "actors/interfaces.hpp"
#include "admin/admin_routes.hpp"
#include "config/config.hpp"

#include <caf/actor_system.hpp>

#include <chrono>

namespace kvs {

/// How long the http-admin thread waits for the admin actor: longer than
/// its own asks (2 s each, admin_store_timeout), which answer 504 first.
inline constexpr std::chrono::seconds admin_call_timeout{60};

class admin_client : public admin_backend {
public:
  /// Spawns the admin actor for `cfg` (which outlives this object).
  admin_client(caf::actor_system& sys, const config& cfg);
  ~admin_client() override;
  admin_client(const admin_client&) = delete;
  admin_client& operator=(const admin_client&) = delete;

  /// The store (null: the cache server is off), the L2 actor (null: no L2
  /// tier) and the gpu-transfer actor (block-id checksums) to ask from now on.
  void watch(store_actor store, l2_actor l2 = {}, gpu_transfer_actor gpu = {});

  /// For the /metrics collector.
  const admin_actor& actor() const { return admin_; }

  http_answer serve(const admin_call& call) override;

private:
  caf::actor_system& sys_;
  admin_actor admin_;
};

/// The policy of `cfg`: loopback from http.listen, the token from
/// http.admin_token or else $KVSIDECAR_ADMIN_TOKEN.
admin_policy admin_policy_of(const config& cfg);

} // namespace kvs
