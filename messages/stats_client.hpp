// stats_client_actor: what every long-lived actor answers besides its own
// messages, so the /metrics collector (metrics/) and the actor tree can hold
// typed handles without knowing each actor's own interface.
#pragma once

#include "messages/type_ids.hpp"

#include <caf/actor.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace kvs {

/// As VAST's status_client_actor: `stats` writes the actor's stats line (on
/// its own timer), `metrics, to` sends a stats_snapshot to `to`. Every
/// interface in actors/interfaces.hpp extends it, so the two handlers are
/// declared once.
using stats_client_actor = caf::typed_actor<
  caf::reacts_to<stats_atom>,
  caf::reacts_to<metrics_atom, caf::actor>>; ///< send a stats_snapshot to the actor

} // namespace kvs
