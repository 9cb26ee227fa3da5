#include "app/sidecar.hpp"

#include "app/actor_tree.hpp"
#include "app/health.hpp"
#include "app/log.hpp"
#include "app/observability.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>

#include <csignal>
#include <cstdlib>
#include <ctime>
#include <set>

namespace kvs {

namespace {

using clock = std::chrono::steady_clock;

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

/// Waits for SIGINT/SIGTERM with no timeout; returns the signal.
int wait_for_signal() {
  auto set = stop_signals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0)
      return sig;
  }
}

/// During shutdown: a second SIGINT (Ctrl-C twice) ends the process at
/// once; a repeated SIGTERM (orchestrators resend it) does not cut the drain.
void exit_on_second_signal(const std::string& me) {
  auto set = stop_signals();
  timespec zero{0, 0};
  int sig = sigtimedwait(&set, nullptr, &zero);
  if (sig == SIGINT) {
    KVS_WARN(me, "second SIGINT during shutdown: exiting now");
    std::_Exit(130);
  }
  if (sig == SIGTERM)
    KVS_INFO(me, "SIGTERM again: already shutting down");
}

/// Bridges that completed the start-up handshake (only they answer stops).
using ready_set = std::set<caf::actor_addr>;

/// Sends stop to `bridges` and collects the acknowledgements of those that
/// are running.
bool stop_bridges(caf::scoped_actor& self, const std::vector<caf::actor>& bridges,
                  const ready_set& ready, clock::time_point deadline, const std::string& me) {
  size_t n = 0;
  for (auto& b : bridges) {
    self->send(b, stop_atom_v);
    n += ready.count(b.address());
  }
  size_t got = 0;
  while (got < n) {
    if (clock::now() >= deadline)
      return false;
    exit_on_second_signal(me);
    self->receive(
      [&](stop_atom, const std::string&) { ++got; },
      [&](ready_atom, const std::string&) {},
      [&](failed_atom, const std::string&, const std::string&) {},
      caf::after(std::chrono::milliseconds{50}) >> [] {});
  }
  return true;
}

bool queues_empty(const actor_tree& t) {
  for (auto& q : t.queues)
    if (q->queued.load() > 0)
      return false;
  return true;
}

void stop_all(caf::scoped_actor& self, actor_tree& t, const ready_set& ready,
              clock::time_point deadline, const std::string& me, bool drain) {
  auto start = clock::now();
  auto drain_deadline = start + (deadline - start) * 6 / 10;
  // 1. Stop taking input.
  if (!stop_bridges(self, t.input_bridges, ready, drain_deadline, me))
    KVS_WARN(me, "input bridges did not stop in time");
  // 2. Drain what was accepted through the publishers to the PUB sockets.
  if (drain) {
    while (!queues_empty(t) && clock::now() < drain_deadline) {
      exit_on_second_signal(me);
      self->receive(caf::after(std::chrono::milliseconds{5}) >> [] {});
    }
    int64_t left = 0;
    for (auto& q : t.queues)
      left += q->queued.load();
    if (left > 0)
      KVS_WARN(me, "shutdown deadline reached with {} batches not yet published", left);
    else
      KVS_INFO(me, "drained: every accepted batch was published");
  }
  // 3. Close the outputs (each flushes and closes its sockets on its thread).
  if (!stop_bridges(self, t.output_bridges, ready, deadline, me))
    KVS_WARN(me, "output bridges did not stop in time");
  // 4. The rest.
  for (auto& w : t.workers)
    self->send_exit(w, caf::exit_reason::user_shutdown);
}

} // namespace

void block_signals() {
  auto set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int run_sidecar(const config& cfg) {
  auto me = log::label("sidecar", cfg.sidecar.name, 0);
  // Declared before the actor system: destroyed after it, when every bridge
  // has closed its sockets.
  zmq::context_t ctx{1};
  zmq::context_t replay_ctx{1};
  caf::actor_system_config sys_cfg;
  sys_cfg.set("scheduler.max-threads", size_t{2});
  // One shared queue whose idle workers block on a condition variable and
  // are woken by the next message. CAF's default work stealing polls in
  // 50 us sleeps for a while after each message, which on a sidecar's small
  // CPU share doubled the cache server's request round trip (BENCHMARKS.md).
  sys_cfg.set("scheduler.policy", caf::atom("sharing"));
  int status = exit_ok;
  {
    caf::actor_system sys{sys_cfg};
    caf::scoped_actor self{sys};
    KVS_INFO(me, "starting: events {}, cache {}, gpu backend \"{}\"",
             cfg.events.enabled ? "on" : "off", cfg.cache.enabled ? "on" : "off",
             cfg.gpu.backend);
    auto obs = start_observability(sys, cfg, me);
    if (!obs.error.empty()) {
      KVS_ERROR(me, "start-up failed: {}", obs.error);
      KVS_INFO(me, "exited with status {}", exit_startup_failed);
      return exit_startup_failed;
    }
    auto tree = spawn_actor_tree(sys, ctx, replay_ctx, cfg, self);
    watch_actors(obs, tree, me);
    // Start-up handshake: every bridge reports ready or why it failed.
    ready_set ready;
    std::vector<std::string> failures;
    auto deadline = clock::now() + std::chrono::seconds{10};
    while (ready.size() + failures.size() < tree.bridge_count() && clock::now() < deadline) {
      self->receive([&](ready_atom, const std::string&) {
                      ready.insert(self->current_sender()->address());
                    },
                    [&](failed_atom, const std::string& who, const std::string& why) {
                      failures.push_back(who + ": " + why);
                    },
                    caf::after(std::chrono::milliseconds{100}) >> [] {});
    }
    if (!tree.error.empty())
      failures.push_back(tree.error);
    if (ready.size() + failures.size() < tree.bridge_count())
      failures.push_back("bridges did not report ready within 10s");
    if (!failures.empty()) {
      health().draining.store(true); // the stops below are expected exits
      for (auto& f : failures)
        KVS_ERROR(me, "start-up failed: {}", f);
      stop_all(self, tree, ready, clock::now() + std::chrono::seconds{2}, me, false);
      status = exit_startup_failed;
    } else {
      for (auto& line : tree.summary)
        KVS_INFO(me, "actor tree: {}", line);
      health().ready.store(true);
      KVS_INFO(me, "kvsidecar ready ({} bridges, {} actors)", tree.bridge_count(),
               tree.workers.size());
      int sig = wait_for_signal();
      // First of all: /readyz answers 503 so the orchestrator stops routing here.
      health().draining.store(true);
      KVS_INFO(me, "{} received: stopping input, draining, closing sockets (deadline {})",
               sig == SIGINT ? "SIGINT" : "SIGTERM", to_string(cfg.sidecar.shutdown_timeout));
      stop_all(self, tree, ready, clock::now() + cfg.sidecar.shutdown_timeout, me, true);
    }
  }
  replay_ctx.close();
  ctx.close();
  KVS_INFO(me, "exited with status {}", status);
  return status;
}

} // namespace kvs
