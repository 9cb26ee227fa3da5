// Every atom and message type actors exchange, in one CAF type-id block.
//
// All messages stay inside the process, so the types are whitelisted as
// "unsafe" (never serialized) instead of getting inspect() overloads.
// KVS_ADD_MESSAGE_TYPE does both (type id and whitelist), so a message type
// is listed once and the two can never drift apart; one entry per line keeps
// merges line-local.
#pragma once

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/type_id.hpp>

#include "cache/kv_event_log.hpp"
#include "messages/cache_messages.hpp"
#include "messages/encoded_batch.hpp"
#include "events_wire/kv_events.hpp"
#include "messages/stats_snapshot.hpp"
#include "messages/l2_messages.hpp"
#include "messages/admin_messages.hpp"
#include "messages/admin_calls.hpp"
#include "messages/http_answer.hpp"
#include "messages/checksum_messages.hpp"

/// Gives message type `T` the next type id of the block and allows it in
/// messages without serialization (both expand to specializations at global
/// scope, so this is valid anywhere inside the block). `T` must not contain
/// a top-level comma: give a template instance a `using` alias first.
#define KVS_ADD_MESSAGE_TYPE(T)                                                \
  CAF_ADD_TYPE_ID(kvsidecar, (T))                                              \
  CAF_ALLOW_UNSAFE_MESSAGE_TYPE(T)

CAF_BEGIN_TYPE_ID_BLOCK(kvsidecar, caf::first_custom_type_id)

  // -- lifecycle ------------------------------------------------------------
  CAF_ADD_ATOM(kvsidecar, kvs, ready_atom, "ready")
  CAF_ADD_ATOM(kvsidecar, kvs, failed_atom, "failed")
  CAF_ADD_ATOM(kvsidecar, kvs, stop_atom, "stop")
  CAF_ADD_ATOM(kvsidecar, kvs, stats_atom, "stats")
  CAF_ADD_ATOM(kvsidecar, kvs, tick_atom, "tick")
  CAF_ADD_ATOM(kvsidecar, kvs, drain_atom, "drain")
  CAF_ADD_ATOM(kvsidecar, kvs, signal_atom, "signal")
  /// `metrics_atom, caf::actor reply_to`: send a stats_snapshot to reply_to
  /// (the /metrics collector; bridges cannot answer requests, so it is a
  /// plain message both ways).
  CAF_ADD_ATOM(kvsidecar, kvs, metrics_atom, "metrics")
  KVS_ADD_MESSAGE_TYPE(kvs::stats_snapshot)

  // -- event relay ----------------------------------------------------------
  CAF_ADD_ATOM(kvsidecar, kvs, publish_atom, "publish")
  CAF_ADD_ATOM(kvsidecar, kvs, record_atom, "record")
  CAF_ADD_ATOM(kvsidecar, kvs, replay_atom, "replay")
  KVS_ADD_MESSAGE_TYPE(kvs::kv_event_batches)
  KVS_ADD_MESSAGE_TYPE(kvs::encoded_batch)
  KVS_ADD_MESSAGE_TYPE(kvs::encoded_batches)
  KVS_ADD_MESSAGE_TYPE(kvs::replay_request)
  KVS_ADD_MESSAGE_TYPE(kvs::replay_stream)
  KVS_ADD_MESSAGE_TYPE(kvs::snapshot_request)
  KVS_ADD_MESSAGE_TYPE(kvs::snapshot_credit)
  KVS_ADD_MESSAGE_TYPE(kvs::snapshot_part)

  // -- cache server ---------------------------------------------------------
  /// A periodic round of expiry: idle sessions (session_router), silent
  /// instances (registry), locks and reservations (store), subscriptions
  /// without PINGs (engine_bridge).
  CAF_ADD_ATOM(kvsidecar, kvs, sweep_atom, "sweep")
  /// `seen_atom, instance, pinged`: the instance showed a sign of life.
  CAF_ADD_ATOM(kvsidecar, kvs, seen_atom, "seen")
  /// `reaped_atom, instance`: the instance is gone (reaped, or its
  /// registration failed): its connection binding and sessions end.
  CAF_ADD_ATOM(kvsidecar, kvs, reaped_atom, "reaped")
  /// `gone_atom, instance` / `gone_atom, identity`: the connection that
  /// owned the instance (or this ROUTER / gRPC identity) ended: its
  /// registration, sessions, locks and staging slots are freed at once.
  CAF_ADD_ATOM(kvsidecar, kvs, gone_atom, "gone")
  /// A session ends now, releasing everything it holds.
  CAF_ADD_ATOM(kvsidecar, kvs, end_atom, "end")
  /// A session's parked WAIT_PREFETCH_STATUS may have reached its deadline.
  CAF_ADD_ATOM(kvsidecar, kvs, deadline_atom, "deadline")
  /// gpu_transfer: poll the copies in flight.
  CAF_ADD_ATOM(kvsidecar, kvs, poll_atom, "poll")
  KVS_ADD_MESSAGE_TYPE(kvs::mp_call)
  KVS_ADD_MESSAGE_TYPE(kvs::mp_reply)
  KVS_ADD_MESSAGE_TYPE(kvs::lmcache_frames)
  KVS_ADD_MESSAGE_TYPE(kvs::lmcache_reply_sink_ptr)
  KVS_ADD_MESSAGE_TYPE(kvs::store_lookup)
  KVS_ADD_MESSAGE_TYPE(kvs::store_release_range)
  KVS_ADD_MESSAGE_TYPE(kvs::store_end_session)
  KVS_ADD_MESSAGE_TYPE(kvs::store_reserve)
  KVS_ADD_MESSAGE_TYPE(kvs::store_reserve_reply)
  KVS_ADD_MESSAGE_TYPE(kvs::store_finish)
  KVS_ADD_MESSAGE_TYPE(kvs::store_acquire)
  KVS_ADD_MESSAGE_TYPE(kvs::store_acquire_reply)
  KVS_ADD_MESSAGE_TYPE(kvs::store_release)
  KVS_ADD_MESSAGE_TYPE(kvs::store_configure)
  KVS_ADD_MESSAGE_TYPE(kvs::store_configure_reply)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_open)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_close)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_copy)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_copy_started)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_await)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_copy_done)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_status_reply)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_stage_open)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_stage_opened)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_stage_take)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_stage_taken)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_stage_copy)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_stage_give)
  KVS_ADD_MESSAGE_TYPE(kvs::gpu_checksum_read)
  KVS_ADD_MESSAGE_TYPE(kvs::block_checksum_chunk)
  KVS_ADD_MESSAGE_TYPE(kvs::kv_event_records)
  KVS_ADD_MESSAGE_TYPE(kvs::l2_write)
  KVS_ADD_MESSAGE_TYPE(kvs::l2_fetch)
  KVS_ADD_MESSAGE_TYPE(kvs::l2_fetch_reply)
  CAF_ADD_ATOM(kvsidecar, kvs, recycle_atom, "recycle")
  CAF_ADD_ATOM(kvsidecar, kvs, prefault_atom, "prefault")
  /// `bridge_atom, engine_bridge_actor`: the engine bridge introduces itself
  /// (every request's reply goes to it) to the session router, which passes
  /// it on to the registry and the store before routing them any request.
  CAF_ADD_ATOM(kvsidecar, kvs, bridge_atom, "bridge")
  /// The gRPC bridge introduces itself to the engine bridge (its replies' way back).
  CAF_ADD_ATOM(kvsidecar, kvs, grpc_atom, "grpc")
  /// A rank published an AllBlocksCleared: the store announces its L1 again.
  CAF_ADD_ATOM(kvsidecar, kvs, cleared_atom, "cleared")
  /// The L2 actor's own turn to announce again, once for every clear queued
  /// before it (a flood of clears costs Redis one EXISTS round, not one each).
  CAF_ADD_ATOM(kvsidecar, kvs, reannounce_atom, "reannounce")
  /// The HTTP control plane's POST /cache/clear {"tier": "l2"|"all"}: the
  /// L2 actor empties its node-local tiers (the disk), answers the count.
  CAF_ADD_ATOM(kvsidecar, kvs, clear_l2_atom, "clear_l2")
  /// L2 quotas (l2.quota_mode = "isolated"): a salt's limit; the usage by salt.
  KVS_ADD_MESSAGE_TYPE(kvs::l2_quota_limit)
  CAF_ADD_ATOM(kvsidecar, kvs, l2_usage_atom, "l2_usage")
  KVS_ADD_MESSAGE_TYPE(kvs::l2_usage)
  /// GET|DELETE /cache/objects on L2.
  KVS_ADD_MESSAGE_TYPE(kvs::l2_list_objects)
  KVS_ADD_MESSAGE_TYPE(kvs::l2_objects_page)
  KVS_ADD_MESSAGE_TYPE(kvs::l2_delete_objects)
  KVS_ADD_MESSAGE_TYPE(kvs::l2_deleted)
  /// The HTTP control plane's requests to the store, one per operation
  /// (messages/admin_messages.hpp), and their replies.
  KVS_ADD_MESSAGE_TYPE(kvs::store_status_query)
  KVS_ADD_MESSAGE_TYPE(kvs::store_status)
  KVS_ADD_MESSAGE_TYPE(kvs::store_clear_l1)
  KVS_ADD_MESSAGE_TYPE(kvs::store_quota_list)
  KVS_ADD_MESSAGE_TYPE(kvs::store_quota_get)
  KVS_ADD_MESSAGE_TYPE(kvs::store_quota_set)
  KVS_ADD_MESSAGE_TYPE(kvs::store_quota_delete)
  KVS_ADD_MESSAGE_TYPE(kvs::store_quota_reply)
  KVS_ADD_MESSAGE_TYPE(kvs::store_list_objects)
  KVS_ADD_MESSAGE_TYPE(kvs::store_objects_page)
  KVS_ADD_MESSAGE_TYPE(kvs::store_delete_objects)
  KVS_ADD_MESSAGE_TYPE(kvs::store_deleted)
  KVS_ADD_MESSAGE_TYPE(kvs::store_lock_chunks)
  KVS_ADD_MESSAGE_TYPE(kvs::store_locked_chunks)
  KVS_ADD_MESSAGE_TYPE(kvs::store_unlock_chunks)

  // -- HTTP control plane -----------------------------------------------------
  /// One message per LMCache HTTP API operation (messages/admin_calls.hpp),
  /// each answered by the admin actor with an http_answer.
  KVS_ADD_MESSAGE_TYPE(kvs::http_answer)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::root)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::healthcheck)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::status)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::config)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::config_adapters)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::version)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::cache_clear)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::quota_list)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::quota_get)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::quota_set)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::quota_delete)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::prefetch_submit)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::prefetch_status)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::objects_list)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::objects_delete)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::chunk_checksums)
  KVS_ADD_MESSAGE_TYPE(kvs::admin_req::block_checksums)
  /// `watch_atom, store, l2, gpu`: the actors the admin actor asks from now on.
  CAF_ADD_ATOM(kvsidecar, kvs, watch_atom, "watch")

CAF_END_TYPE_ID_BLOCK(kvsidecar)
