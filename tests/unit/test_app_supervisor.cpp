// Supervision (app/supervisor.hpp) with a real actor system: the first
// watched actor to exit — killed, failed or returned — ends wait_for_stop
// with its name and reason; unwatched actors do not; a stop signal read by
// the signal watcher ends it too.
#include "app/signal_watcher.hpp"
#include "app/supervisor.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <doctest/doctest.h>

#include <csignal>
#include <unistd.h>

using namespace kvs;

namespace {

// As in the sidecar: SIGINT/SIGTERM blocked in every thread (set before
// main, so every thread inherits it), read only through the signal watcher.
const bool signals_blocked = [] {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0;
}();

struct worker_state {
  static inline const char* name = "test_worker";
};

/// Idles until told to stop: `stop` makes it return normally. (The unused
/// argument: CAF 0.17 binds an empty argument tuple through a null pointer,
/// which UBSan reports, when an actor is spawned without arguments.)
caf::behavior worker(caf::stateful_actor<worker_state>* self, int) {
  return {[self](stop_atom) { self->quit(); }};
}

} // namespace

TEST_CASE("supervisor: a killed actor is reported first, with its name and the kill reason") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto a = sys.spawn(worker, 0);
  auto b = sys.spawn(worker, 0);
  auto unwatched = sys.spawn(worker, 0);
  supervisor sup;
  sup.watch(self, a);
  sup.watch(self, b);
  CHECK(sup.watched() == 2);
  CHECK_FALSE(sup.first_down());

  self->send_exit(b, caf::exit_reason::kill);
  auto cause = wait_for_stop(self, sup);
  REQUIRE(cause.down);
  CHECK(cause.signal == 0);
  CHECK(cause.down->name == "test_worker#" + std::to_string(b.id()));
  CHECK(cause.down->reason == caf::exit_reason::kill);
  CHECK(cause.down->reason_text().find("kill") != std::string::npos);
  CHECK(sup.is_down(b.address()));
  CHECK_FALSE(sup.is_down(a.address()));
  REQUIRE(sup.first_down());
  CHECK(sup.first_down()->name == cause.down->name);

  // An actor nobody watches may come and go; a watched one that returns
  // normally (no error) is still an unexpected exit.
  self->send_exit(unwatched, caf::exit_reason::kill);
  self->send(a, stop_atom_v);
  auto second = wait_for_stop(self, sup);
  REQUIRE(second.down);
  CHECK(second.down->name == "test_worker#" + std::to_string(a.id()));
  CHECK_FALSE(second.down->reason);
  CHECK(second.down->reason_text() == "returned normally");
  // The first report stays the first.
  CHECK(sup.first_down()->name == cause.down->name);
}

TEST_CASE("supervisor: an actor already dead when watched is reported at once") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto a = sys.spawn(worker, 0);
  self->monitor(a); // to know when it is gone
  self->send_exit(a, caf::exit_reason::user_shutdown);
  self->receive([](caf::down_msg&) {});
  supervisor sup;
  sup.watch(self, a);
  auto cause = wait_for_stop(self, sup);
  REQUIRE(cause.down);
  CHECK(cause.down->name.rfind("test_worker#", 0) == 0);
}

TEST_CASE("signal watcher: SIGTERM to the process ends wait_for_stop with the signal") {
  REQUIRE(signals_blocked);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto a = sys.spawn(worker, 0);
  supervisor sup;
  sup.watch(self, a);
  std::atomic<int> calls{0};
  {
    signal_watcher w{[&, target = caf::actor_cast<caf::actor>(self)](int sig) {
      ++calls;
      caf::anon_send(target, signal_atom_v, sig);
    }};
    REQUIRE(w.error().empty());
    REQUIRE(kill(getpid(), SIGTERM) == 0);
    auto cause = wait_for_stop(self, sup);
    CHECK(cause.signal == SIGTERM);
    CHECK_FALSE(cause.down);
  } // joins the watcher thread
  CHECK(calls == 1);
  self->send_exit(a, caf::exit_reason::user_shutdown);
}
