// Every op-table row has its handler where its route points: the tables
// keyed by op beside the op table (actors/cache/op_handlers.hpp) are
// complete, so an op added to the table without its handler fails here.
#include "actors/cache/op_handlers.hpp"
#include "lmcache_wire/lmcache_ops.hpp"

#include <doctest/doctest.h>

using namespace kvs;

TEST_CASE("every row's route has a handler for its op, and no other actor serves it") {
  size_t n = 0;
  for (const auto& row : all_op_rows()) {
    INFO("op " << row.name << ", route " << to_string(row.route));
    ++n;
    const bool bridge = bridge_answers(row.op);
    const bool registry = registry_serves(row.op);
    const bool session = session_serves(row.op);
    const bool streams = bridge_streams(row.op);
    // A streamed row (subscribe_kv_events) is opened by the engine bridge's
    // stream handler, and only there; every other op has no stream handler.
    CHECK(streams == row.streamed);
    if (row.streamed)
      CHECK(row.route == mp_route::bridge);
    switch (row.route) {
      case mp_route::bridge:
        CHECK(bridge != row.streamed); // a request handler, or a stream handler
        CHECK_FALSE(registry);
        CHECK_FALSE(session);
        break;
      case mp_route::registry:
        CHECK(registry);
        CHECK_FALSE(bridge);
        CHECK_FALSE(session);
        break;
      case mp_route::new_session:
      case mp_route::session:
      case mp_route::end_session:
        CHECK(session);
        CHECK_FALSE(bridge);
        CHECK_FALSE(registry);
        break;
      case mp_route::store_clear:
        // The store's one op handler, on_clear (test_grpc_op_table: clear alone).
        CHECK(row.op == mp_op::clear);
        CHECK_FALSE(bridge);
        CHECK_FALSE(registry);
        CHECK_FALSE(session);
        break;
    }
  }
  CHECK(n > 0);
}
