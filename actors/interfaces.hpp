// Every typed actor interface of kvsidecar, in one place.
//
// Bridges (actors that own ZeroMQ sockets) are blocking actors on their own
// threads and are addressed through plain caf::actor handles; the messages
// they take are listed next to each bridge's class. Everything else is an
// event-based actor with a typed interface below.
#pragma once

#include <caf/typed_actor.hpp>
#include <caf/replies_to.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "messages/type_ids.hpp"

namespace kvs {

// -- bridges, as typed handles for typed senders (actor_cast of the bridge) --

/// pub_bridge[dp=r] (actors/pub_bridge.hpp): sends a batch to routers.
using pub_bridge_actor = caf::typed_actor<caf::reacts_to<publish_atom, encoded_batch>>;

/// replay_bridge[dp=r] (actors/replay_bridge.hpp): streams a replay to a client.
using replay_bridge_actor = caf::typed_actor<caf::reacts_to<replay_stream>>;

// -- event relay -------------------------------------------------------------

/// publisher[dp=r] — one per DP rank. Owns the rank's sequence number:
/// assigns 0, 1, 2, … with no gaps, encodes each batch in the configured
/// dialect, hands it to the PUB bridge and to the rank's replay actor.
/// Fed by the ingest bridges and by the cache store (its own events).
using publisher_actor = caf::typed_actor<
  caf::reacts_to<publish_atom, kv_event_batch>,
  caf::reacts_to<stats_atom>>;

/// replay[dp=r] — one per DP rank. Keeps the last buffer_steps encoded
/// batches; answers a replay request by sending a replay_stream (shared
/// payloads, no copies) to the replay bridge that asked, which streams it at
/// the client's pace. Live publishing never waits for a replay.
using replay_actor = caf::typed_actor<
  caf::reacts_to<record_atom, encoded_batch>,
  caf::reacts_to<replay_atom, replay_request>,
  caf::reacts_to<stats_atom>>;

} // namespace kvs
