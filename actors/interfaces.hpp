// Every typed actor interface of kvsidecar, in one place.
//
// Bridges (actors that own ZeroMQ sockets, actors/zmq_bridge.hpp) are
// blocking actors on their own threads; their interfaces below extend
// bridge_actor (stop, stats, metrics), and zmq_bridge::typed_handlers checks
// each bridge's handlers against its interface. Everything else is an
// event-based actor with a typed interface extending stats_client_actor.
#pragma once

#include <caf/typed_actor.hpp>
#include <caf/replies_to.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "messages/stats_client.hpp"
#include "messages/type_ids.hpp"

namespace kvs {

// -- bridges -----------------------------------------------------------------

/// What every bridge answers (zmq_bridge's built-ins): `stop` (the shutdown
/// handshake: drain, close the sockets on the bridge's thread, answer
/// `stop, label` to the supervisor) and stats_client_actor's two.
using bridge_actor =
  caf::typed_actor<caf::reacts_to<stop_atom>>::extend_with<stats_client_actor>;

/// pub_bridge[dp=r] (actors/relay/pub_bridge.hpp): sends a batch to routers.
/// join_bridge[dp=r] (actors/relay/join_bridge.hpp, events.join_endpoint) takes
/// the same message: the rank's state first, then live, for one router.
using pub_bridge_actor =
  caf::typed_actor<caf::reacts_to<publish_atom, encoded_batches>>::extend_with<bridge_actor>;

/// replay_bridge[dp=r] (actors/relay/replay_bridge.hpp): streams a replay, or a
/// snapshot part by part, to a client. The join bridge takes snapshot parts
/// the same way (the indexer answers whichever bridge asked).
using replay_bridge_actor =
  caf::typed_actor<caf::reacts_to<replay_stream>,
                   caf::reacts_to<snapshot_part>>::extend_with<bridge_actor>;

/// join_bridge[dp=r] (actors/relay/join_bridge.hpp): the publisher's batches
/// as the PUB bridge takes them, and the indexer's snapshot parts as the
/// replay bridge takes them (it is addressed as either).
using join_bridge_actor =
  caf::typed_actor<caf::reacts_to<publish_atom, encoded_batches>,
                   caf::reacts_to<snapshot_part>>::extend_with<bridge_actor>;

/// ingest_bridge[dp=r] (actors/relay/ingest_bridge.hpp): its work comes from
/// its sockets; it takes only the bridges' built-ins.
using ingest_bridge_actor = bridge_actor;

// -- event relay -------------------------------------------------------------

/// What a publisher tells after each AllBlocksCleared (the store and the L2
/// actor take it; each announces its chunks again).
using clear_listener_actor = caf::typed_actor<caf::reacts_to<cleared_atom>>;

/// publisher[dp=r] — one per DP rank. Owns the rank's sequence number:
/// assigns 0, 1, 2, … with no gaps, encodes each batch in the configured
/// dialect (or passes the engine's bytes through), hands it to the PUB
/// bridge and to the rank's replay actor, and the batch itself to the
/// rank's indexer. Seq 0 is its own AllBlocksCleared (routers drop blocks
/// kept from before). Fed by the ingest bridges and by the cache store (its
/// own events). Nothing but this live path runs in it. With
/// events.keepalive_interval, a rank that published nothing for that long
/// publishes an empty batch (a new seq: a router can tell a quiet engine
/// from a dead sidecar, and sees a gap at once). `cleared, a`: after each
/// AllBlocksCleared this rank publishes (the engine's, or the restart
/// fence), `a` (the store, the L2 actor) gets `cleared`: routers have just
/// dropped the rank's CPU, DISK and SHARED chunks too.
using publisher_actor = caf::typed_actor<
  caf::reacts_to<publish_atom, kv_event_batches>,
  caf::reacts_to<cleared_atom, clear_listener_actor>, ///< who to tell after an AllBlocksCleared
  caf::reacts_to<tick_atom>>::extend_with<stats_client_actor>; ///< keep-alive check

/// indexer[dp=r] — one per DP rank, on its own thread (actors/relay/indexer.hpp).
/// `publish_atom, first_seq, held, batches`: what the publisher published,
/// seq first_seq on (holding `held` bytes of the rank's relay_queue
/// indexing_bytes, released once applied), applied in order to the rank's block index
/// (relay/block_index.hpp). Serves snapshots of the index to the replay
/// bridge, one part of raw BlockStored batches per credit
/// (actors/relay/indexer_snapshot.hpp); the bridge encodes and streams them. Off
/// the live path: a live batch never waits behind an index update or a
/// snapshot part.
using indexer_actor = caf::typed_actor<
  caf::reacts_to<publish_atom, uint64_t, int64_t, kv_event_batches>,
  caf::reacts_to<snapshot_request>,
  caf::reacts_to<snapshot_credit>>::extend_with<stats_client_actor>;

/// replay[dp=r] — one per DP rank. Keeps the last buffer_steps encoded
/// batches; answers each part of a replay (replay_request: from a seq, up
/// to the newest when the replay began, a part at most) with a
/// replay_stream (shared payloads, no copies) to the replay bridge that
/// asked, which streams it at the client's pace. Live publishing never
/// waits for a replay.
using replay_actor = caf::typed_actor<
  caf::reacts_to<record_atom, encoded_batches>,
  caf::reacts_to<replay_atom, replay_request>>::extend_with<stats_client_actor>;

} // namespace kvs

namespace kvs {

// -- cache server ------------------------------------------------------------

/// engine_bridge (actors/cache/engine_bridge.hpp) — the ROUTER engine connectors
/// talk to. Owns the socket: decodes LMCache MP requests, checks which
/// connection may use an instance, answers what needs no actor (chunk size,
/// noop, ping) and hands the rest to the session router; sends the replies
/// every actor addresses to it.
using engine_bridge_actor = caf::typed_actor<
  caf::reacts_to<mp_reply>,
  caf::reacts_to<kv_event_records>,         ///< for subscribe_kv_events streams
  caf::reacts_to<reaped_atom, int64_t>,     ///< instance gone: free its binding
  caf::reacts_to<lmcache_frames>,           ///< a request that came over gRPC
  caf::reacts_to<grpc_atom, lmcache_reply_sink_ptr>, ///< where the gRPC replies go
  caf::reacts_to<sweep_atom>>::extend_with<bridge_actor>; ///< its own timer: kv-event subscriptions without a PING expire

/// grpc_bridge (actors/cache/grpc_bridge.hpp) — LMCache's gRPC transport
/// (cache.grpc_endpoint): turns each RPC into the frames a ZeroMQ client
/// sends and hands them to the engine bridge, which serves them as it serves
/// ZeroMQ and hands each reply to the bridge's server (lmcache_reply_sink).
/// It takes only the bridges' built-ins.
using grpc_bridge_actor = bridge_actor;

/// session_router (actors/cache/session_router.hpp) — routes decoded requests:
/// registrations to the registry, CLEAR to the store, request-id ops to a
/// session per request id, which it spawns and is the only one to address,
/// so a session never receives a request after it was told to end. Owns
/// session lifetimes: a session is idle when no request was routed to it for
/// session_ttl (the one definition of idle), and ends then, at END_SESSION,
/// when an instance it used is gone, or when every connection that sent it
/// requests has ended. Answers for unknown jobs. Replies go
/// straight to the engine bridge (requests are delegated, the bridge stays
/// their sender).
using session_router_actor = caf::typed_actor<
  caf::reacts_to<mp_call>,
  caf::reacts_to<bridge_atom, engine_bridge_actor>, ///< where replies go: kept, passed on
  caf::reacts_to<seen_atom, int64_t, bool>, ///< a PING: tells the registry
  caf::reacts_to<reaped_atom, int64_t>, ///< instance gone: end its sessions
  caf::reacts_to<gone_atom, int64_t>,   ///< its connection ended: end its sessions, drop it
  caf::reacts_to<gone_atom, std::string>, ///< a connection ended: sessions only it used end
  caf::reacts_to<sweep_atom>>::extend_with<stats_client_actor>; ///< idle sweep

/// session[rid=…] — one per request id. Runs LOOKUP (hash, lock the hit
/// prefix through the store), answers the prefetch queries, drives STORE and
/// RETRIEVE copies through the GPU-transfer actor, and releases whatever the
/// request still holds when it ends (END_SESSION, session_ttl, or its
/// instance being reaped). The session router keeps the idle clock (it sees
/// every request), so an idle session costs no timer.
using session_actor = caf::typed_actor<
  caf::reacts_to<mp_call>,
  caf::reacts_to<end_atom>,       ///< end now, releasing everything
  caf::reacts_to<deadline_atom>>; ///< a parked WAIT_PREFETCH_STATUS may have timed out

/// registry — engine instances: their KV-cache registrations, layouts and
/// liveness. Opens an instance's pools in the GPU-transfer actor, tells the
/// store the instance's chunk size, and reaps silent instances
/// (heartbeat_timeout, or registration_grace for those that never pinged).
using registry_actor = caf::typed_actor<
  caf::reacts_to<mp_call>,                  ///< register / unregister
  caf::reacts_to<bridge_atom, engine_bridge_actor>, ///< where replies go (from the router)
  caf::reacts_to<seen_atom, int64_t, bool>, ///< instance seen (true: it pinged)
  caf::reacts_to<gone_atom, int64_t>,       ///< its connection ended: drop it now
  caf::reacts_to<sweep_atom>>::extend_with<stats_client_actor>; ///< reaper round

/// store — sole owner of the L1 pool and chunk index: lookup-and-lock,
/// reserve, commit/abort, acquire/release for reads, LRU eviction between
/// the watermarks, lock TTL (sessions' idle TTL is the session router's).
/// Announces committed and evicted
/// chunks as BlockStored / BlockRemoved through a publisher, and as
/// kv_event_records (per model) to the engine bridge's subscribe_kv_events log.
/// When that publisher's rank publishes an AllBlocksCleared (`cleared`:
/// vLLM's reset_prefix_cache, an engine restart's fence), routers drop
/// every block of the rank, L1's chunks with them; the store announces
/// every rank-0 chunk it still holds again, oldest first (a chunk after
/// its parent).
using store_actor = caf::typed_actor<
  caf::replies_to<store_lookup>::with<uint64_t>,
  caf::reacts_to<store_release_range>,
  caf::replies_to<store_end_session>::with<uint64_t>,
  caf::replies_to<store_reserve>::with<store_reserve_reply>,
  caf::reacts_to<store_finish>,
  caf::replies_to<store_acquire>::with<store_acquire_reply>,
  caf::reacts_to<store_release>,
  caf::replies_to<store_configure>::with<store_configure_reply>,
  caf::reacts_to<mp_call>, ///< clear
  caf::reacts_to<bridge_atom, engine_bridge_actor>, ///< where replies go (from the router)
  caf::reacts_to<record_atom, engine_bridge_actor>, ///< where kv_event_records go
  caf::reacts_to<cleared_atom>,            ///< routers dropped L1's chunks: announce them again
  // The HTTP control plane (the admin actor), one message per operation:
  caf::replies_to<store_status_query>::with<store_status>,   ///< GET /status
  caf::replies_to<store_clear_l1>::with<uint64_t>,           ///< POST /cache/clear: chunks dropped
  caf::replies_to<store_quota_list>::with<store_quota_reply>, ///< GET /quota
  caf::replies_to<store_quota_get>::with<store_quota_reply>,  ///< GET /quota/{salt}
  caf::replies_to<store_quota_set>::with<store_quota_reply>,  ///< PUT /quota/{salt}
  caf::replies_to<store_quota_delete>::with<store_quota_reply>, ///< DELETE /quota/{salt}
  caf::replies_to<store_list_objects>::with<store_objects_page>, ///< GET /cache/objects (l1)
  caf::replies_to<store_delete_objects>::with<store_deleted>,    ///< DELETE /cache/objects (l1)
  caf::replies_to<store_lock_chunks>::with<store_locked_chunks>, ///< POST /cache/checksums
  caf::reacts_to<store_unlock_chunks>,                           ///< ... its locks back
  caf::reacts_to<sweep_atom>,                                    ///< lock and reservation expiry
  caf::reacts_to<prefault_atom, uint32_t>>::extend_with<stats_client_actor>; ///< an arena's next extent

/// gpu_transfer — opens engine pools (CUDA IPC or host shared memory) once
/// per instance and copies pages between them and L1 slots. For
/// engine-driven instances it owns their staging pools (gpu/staging_pool)
/// and copies whole chunks between those and L1. Answers a copy at
/// once with the event to hand the engine, and its completion later. Holds
/// L1 alive for as long as a copy may touch it. `drain` (shutdown) refuses
/// new copies and answers, with the number it waited for, once no copy is
/// in flight.
using gpu_transfer_actor = caf::typed_actor<
  caf::replies_to<gpu_open>::with<gpu_status_reply>,
  caf::reacts_to<gpu_close>,
  caf::replies_to<gpu_copy>::with<gpu_copy_started>,
  caf::replies_to<gpu_await>::with<gpu_copy_done>,
  caf::replies_to<gpu_stage_open>::with<gpu_stage_opened>, ///< engine-driven staging pools
  caf::replies_to<gpu_stage_take>::with<gpu_stage_taken>,
  caf::replies_to<gpu_stage_copy>::with<gpu_copy_done>,
  caf::reacts_to<gpu_stage_give>,
  caf::replies_to<gpu_checksum_read>::with<block_checksum_chunk>, ///< POST /cache/checksums by block ids
  caf::replies_to<drain_atom>::with<uint64_t>,
  caf::reacts_to<poll_atom>>::extend_with<stats_client_actor>;

/// l2 — the L2 backends (l2/l2_backend.hpp) on a thread of its own
/// (detached: disk and Redis I/O block). Writes committed chunks through
/// (bounded by l2.queue_bytes, counted by the store) and answers the store's
/// prefetches. Announces what the tiers hold as BlockStored/BlockRemoved
/// with medium "DISK" / "SHARED", and, like the store, announces them again
/// after its events rank's AllBlocksCleared (the chunks a tier still holds;
/// Redis asked first, as another node's LRU or the TTL may have dropped them).
using l2_actor = caf::typed_actor<
  caf::reacts_to<l2_write>,
  caf::replies_to<l2_fetch>::with<l2_fetch_reply>,
  caf::reacts_to<recycle_atom, l2_fetch_reply>, ///< a reply's buffers, copied into L1: reuse them
  caf::reacts_to<cleared_atom>,                 ///< routers dropped L2's chunks: announce them again
  caf::reacts_to<reannounce_atom>,              ///< ... once per run of clears (its own message)
  caf::replies_to<clear_l2_atom>::with<uint64_t>, ///< empty the node-local backends (HTTP clear): objects removed, announced as BlockRemoved
  caf::reacts_to<l2_quota_limit>,                 ///< a salt's L2 limit (l2.quota_mode = "isolated")
  caf::replies_to<l2_usage_atom>::with<l2_usage>, ///< bytes by salt, summed over the backends
  caf::replies_to<l2_list_objects>::with<l2_objects_page>, ///< GET /cache/objects (tier l2)
  caf::replies_to<l2_delete_objects>::with<l2_deleted>,    ///< DELETE /cache/objects (tier l2)
  caf::reacts_to<tick_atom>>::extend_with<stats_client_actor>; ///< a quota pass (every l2.quota_interval)

// -- HTTP control plane ------------------------------------------------------

/// admin (admin/admin_actor.hpp) — the backend of LMCache's HTTP API, on a
/// thread of its own (detached: it hashes chunks with MD5). The HTTP server's
/// `http-admin` thread parses a request into one of these calls
/// (messages/admin_calls.hpp), asks with a deadline and writes back the
/// http_answer. Answers from the health atomics and the effective config,
/// asks the store, the L2 actor and the gpu-transfer actor (each within
/// admin_store_timeout: 504 past it), keeps the prefetch jobs
/// (POST /cache/prefetches: a store LOOKUP each) and orchestrates the clears
/// of L1 and L2. `watch_atom`: the actors to ask from now on (null: that part
/// is off), sent once the tree is up; calls before it answer 503 where they
/// need one.
using admin_actor = caf::typed_actor<
  caf::reacts_to<watch_atom, store_actor, l2_actor, gpu_transfer_actor>,
  caf::replies_to<admin_req::root>::with<http_answer>,
  caf::replies_to<admin_req::healthcheck>::with<http_answer>,
  caf::replies_to<admin_req::status>::with<http_answer>,
  caf::replies_to<admin_req::config>::with<http_answer>,
  caf::replies_to<admin_req::config_adapters>::with<http_answer>,
  caf::replies_to<admin_req::version>::with<http_answer>,
  caf::replies_to<admin_req::cache_clear>::with<http_answer>,
  caf::replies_to<admin_req::quota_list>::with<http_answer>,
  caf::replies_to<admin_req::quota_get>::with<http_answer>,
  caf::replies_to<admin_req::quota_set>::with<http_answer>,
  caf::replies_to<admin_req::quota_delete>::with<http_answer>,
  caf::replies_to<admin_req::prefetch_submit>::with<http_answer>,
  caf::replies_to<admin_req::prefetch_status>::with<http_answer>,
  caf::replies_to<admin_req::objects_list>::with<http_answer>,
  caf::replies_to<admin_req::objects_delete>::with<http_answer>,
  caf::replies_to<admin_req::chunk_checksums>::with<http_answer>,
  caf::replies_to<admin_req::block_checksums>::with<http_answer>>::extend_with<stats_client_actor>;

} // namespace kvs
