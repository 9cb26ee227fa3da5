// Which ops each serving actor has a handler for: the tables keyed by op
// beside the op table (lmcache_wire/lmcache_ops.cpp). A row's route names
// where its op is served; tests/unit/test_actor_op_handlers.cpp asserts
// that every row has its handler there, so an op added to the table
// without one fails the build's tests rather than a client's request.
// No CAF here.
#pragma once

#include "lmcache_wire/lmcache_protocol.hpp"

namespace kvs {

/// The engine bridge answers `op` itself (route bridge): engine_bridge.cpp.
bool bridge_answers(mp_op op);
/// The engine bridge opens `op`'s stream (rows `streamed`):
/// engine_bridge.cpp's stream_handlers_.
bool bridge_streams(mp_op op);
/// The registry serves `op` (route registry): registry.cpp's k_steps.
bool registry_serves(mp_op op);
/// A session serves `op` (routes new_session, session, end_session):
/// session.cpp's k_steps.
bool session_serves(mp_op op);

} // namespace kvs
