// close_contexts_until (app/context_close.hpp): contexts whose sockets are
// closed end at once; one that zmq_ctx_term waits on past the deadline
// (here a socket left open, the one hang that can be made on purpose) is
// reported without blocking the caller past it.
#include "app/context_close.hpp"

#include <doctest/doctest.h>
#include <zmq.hpp>

#include <chrono>

using namespace kvs;
using clock_type = std::chrono::steady_clock;

TEST_CASE("contexts whose sockets are closed end before the deadline") {
  zmq::context_t a{1}, b{1};
  {
    zmq::socket_t s{a, zmq::socket_type::pub};
    s.set(zmq::sockopt::linger, 0);
    s.bind("inproc://closed");
  }
  auto t0 = clock_type::now();
  CHECK(close_contexts_until({&a, &b}, t0 + std::chrono::seconds{10}));
  CHECK(clock_type::now() - t0 < std::chrono::seconds{5});
  CHECK(a.handle() == nullptr);
  CHECK(b.handle() == nullptr);
}

TEST_CASE("a context that does not end by the deadline is reported and the caller goes on") {
  // Never destroyed: after a false return the helper thread still uses the
  // context (the sidecar then _Exits). Held by statics, so not a leak.
  static auto* ctx = new zmq::context_t{1};
  static auto* open = new zmq::socket_t{*ctx, zmq::socket_type::pub};
  open->bind("inproc://left-open");
  auto t0 = clock_type::now();
  CHECK_FALSE(close_contexts_until({ctx}, t0 + std::chrono::milliseconds{100}));
  auto waited = clock_type::now() - t0;
  CHECK(waited >= std::chrono::milliseconds{100});
  CHECK(waited < std::chrono::seconds{5});
  // The documented way out of zmq_ctx_term: the socket's owner closes it.
  open->close();
}
