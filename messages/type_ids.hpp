// Every atom and message type actors exchange, in one CAF type-id block.
//
// All messages stay inside the process, so the types are whitelisted as
// "unsafe" (never serialized) instead of getting inspect() overloads.
#pragma once

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/type_id.hpp>

#include "cache/kv_event_log.hpp"
#include "messages/cache_messages.hpp"
#include "messages/encoded_batch.hpp"
#include "messages/kv_events.hpp"
#include "messages/stats_snapshot.hpp"
#include "messages/l2_messages.hpp"

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
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::stats_snapshot))

  // -- event relay ----------------------------------------------------------
  CAF_ADD_ATOM(kvsidecar, kvs, publish_atom, "publish")
  CAF_ADD_ATOM(kvsidecar, kvs, record_atom, "record")
  CAF_ADD_ATOM(kvsidecar, kvs, replay_atom, "replay")
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::kv_event_batches))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::encoded_batch))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::encoded_batches))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::replay_request))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::replay_stream))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::snapshot_request))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::snapshot_credit))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::snapshot_part))

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
  /// A session ends now, releasing everything it holds.
  CAF_ADD_ATOM(kvsidecar, kvs, end_atom, "end")
  /// A session's parked WAIT_PREFETCH_STATUS may have reached its deadline.
  CAF_ADD_ATOM(kvsidecar, kvs, deadline_atom, "deadline")
  /// gpu_transfer: poll the copies in flight.
  CAF_ADD_ATOM(kvsidecar, kvs, poll_atom, "poll")
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::mp_call))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::mp_reply))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_lookup))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_release_range))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_end_session))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_reserve))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_reserve_reply))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_finish))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_acquire))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_acquire_reply))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_release))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_configure))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::store_configure_reply))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_open))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_close))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_copy))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_copy_started))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_await))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_copy_done))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::gpu_status_reply))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::kv_event_records))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::l2_write))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::l2_fetch))
  CAF_ADD_TYPE_ID(kvsidecar, (kvs::l2_fetch_reply))

CAF_END_TYPE_ID_BLOCK(kvsidecar)

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::stats_snapshot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::kv_event_batches)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::encoded_batch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::encoded_batches)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::replay_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::replay_stream)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::snapshot_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::snapshot_credit)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::snapshot_part)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::mp_call)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::mp_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_lookup)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_release_range)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_end_session)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_reserve)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_reserve_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_finish)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_acquire)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_acquire_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_release)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_configure)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::store_configure_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_open)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_close)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_copy)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_copy_started)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_await)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_copy_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::gpu_status_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::kv_event_records)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::l2_write)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::l2_fetch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(kvs::l2_fetch_reply)
