// Which ROUTER identity each connection carries (actors/cache/peer_connections.hpp):
// the engine bridge releases an instance when the connection that owns it ends.
#include "actors/cache/peer_connections.hpp"

#include <doctest/doctest.h>

using namespace kvs;

TEST_CASE("a descriptor is bound to the identity of its first message, once") {
  peer_connections c;
  CHECK(c.needs_drain(7, "A"));
  CHECK_FALSE(c.bind(7, "A"));
  CHECK_FALSE(c.needs_drain(7, "A")); // later messages of A: no monitor read
  CHECK_FALSE(c.bind(7, "A"));
  CHECK(c.needs_drain(7, "B"));
  CHECK(c.size() == 1);
}

TEST_CASE("DISCONNECTED names the identity that ended; an unbound descriptor names none") {
  peer_connections c;
  c.bind(7, "A");
  c.bind(8, "B");
  CHECK_FALSE(c.disconnected(9)); // accepted, never sent a message
  auto gone = c.disconnected(7);
  REQUIRE(gone);
  CHECK(*gone == "A");
  CHECK_FALSE(c.disconnected(7)); // reported once
  CHECK(c.size() == 1);
}

TEST_CASE("a reused descriptor: the old identity is named when bound without its event") {
  // The bridge reads the monitor before binding a descriptor to a new
  // identity, so A's DISCONNECTED normally comes first; should it not,
  // bind() still names A as ended rather than leave it bound for ever.
  peer_connections c;
  c.bind(7, "A");
  auto before = c.bind(7, "C");
  REQUIRE(before);
  CHECK(*before == "A");
  CHECK(*c.disconnected(7) == "C");
}
