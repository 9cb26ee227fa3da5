// connection_gate (actors/connection_gate.hpp): the count a listening socket's
// monitor keeps, the ZAP handler's admit decision, the registry by domain.
#include <doctest/doctest.h>

#include "actors/connection_gate.hpp"

#include <zmq.h>

#include <cstring>

using namespace kvs;

TEST_CASE("a gate counts accepted minus disconnected connections by descriptor") {
  auto g = make_connection_gate("events.replay_endpoint dp=0", "events.max_connections", 2);
  CHECK(g->open() == 0);
  g->on_monitor_event(ZMQ_EVENT_ACCEPTED, 10);
  g->on_monitor_event(ZMQ_EVENT_ACCEPTED, 11);
  CHECK(g->open() == 2);
  g->on_monitor_event(ZMQ_EVENT_ACCEPTED, 11);  // never twice for one descriptor
  CHECK(g->open() == 2);
  g->on_monitor_event(ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0);  // other events change nothing
  g->on_monitor_event(ZMQ_EVENT_DISCONNECTED, 99);  // one it never saw
  CHECK(g->open() == 2);
  g->on_monitor_event(ZMQ_EVENT_DISCONNECTED, 10);
  CHECK(g->open() == 1);
}

TEST_CASE("past the cap a handshake is refused and counted; below it admitted again") {
  auto g = make_connection_gate("cache.endpoint", "cache.max_connections", 2);
  for (uint32_t fd : {5u, 6u})
    g->on_monitor_event(ZMQ_EVENT_ACCEPTED, fd);
  CHECK(g->admit() == 0);  // the second is within the cap (it counts itself)
  g->on_monitor_event(ZMQ_EVENT_ACCEPTED, 7);
  CHECK(g->admit() == 1);
  CHECK(g->admit() == 2);
  CHECK(g->refused() == 2);
  g->on_monitor_event(ZMQ_EVENT_DISCONNECTED, 7);
  CHECK(g->admit() == 0);
  CHECK(g->refused() == 2);
}

TEST_CASE("the ZAP handler finds a live gate by its domain, and not once it is gone") {
  auto a = make_connection_gate("a", "k", 1);
  auto b = make_connection_gate("b", "k", 1);
  CHECK(a->domain() != b->domain());
  CHECK(find_connection_gate(a->domain()).get() == a.get());
  auto domain = b->domain();
  b.reset();
  CHECK(find_connection_gate(domain).get() == nullptr);
  CHECK(find_connection_gate("kvsidecar").get() == nullptr);  // CURVE's domain: no gate
}

TEST_CASE("monitor event frames: 6 bytes, event id then value, else refused") {
  unsigned char frame[6];
  uint16_t ev = ZMQ_EVENT_ACCEPTED;
  uint32_t fd = 42;
  std::memcpy(frame, &ev, 2);
  std::memcpy(frame + 2, &fd, 4);
  uint16_t e = 0;
  uint32_t v = 0;
  REQUIRE(parse_monitor_event(frame, 6, e, v));
  CHECK(e == ZMQ_EVENT_ACCEPTED);
  CHECK(v == 42u);
  CHECK_FALSE(parse_monitor_event(frame, 5, e, v));
  CHECK_FALSE(parse_monitor_event(frame, 10, e, v));
}
