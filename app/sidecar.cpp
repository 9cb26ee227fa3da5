#include "app/sidecar.hpp"

#include "actors/thread_priority.hpp"
#include "app/actor_tree.hpp"
#include "app/context_close.hpp"
#include "app/relay_tree.hpp"
#include "app/open_files_limit.hpp"
#include "actors/zap_handler.hpp"
#include "app/memory_trim.hpp"
#include "metrics/health.hpp"
#include "log/log.hpp"
#include "app/coordinator_events.hpp"
#include "app/coordinator_member.hpp"
#include "app/observability.hpp"
#include "app/signal_watcher.hpp"
#include "app/supervisor.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <csignal>
#include <cstdlib>
#include <ctime>
#include <atomic>
#include <set>

namespace kvs {

namespace {

using clock = std::chrono::steady_clock;

/// How long the bridges have to report ready (or why not) at start-up. They
/// only create, bind and connect sockets (ZeroMQ connects in the background),
/// which takes milliseconds: a bridge silent this long is stuck, not slow.
constexpr std::chrono::seconds startup_timeout{10};
/// How long the stops after a failed start-up may take: nothing was accepted
/// yet, so there is nothing to drain, only sockets to close.
constexpr std::chrono::seconds failed_startup_stop_timeout{2};
/// How often shutdown looks at the publishers' queues while they drain (they
/// are counters, not messages): short against sidecar.shutdown_timeout.
constexpr std::chrono::milliseconds drain_check_every{5};
/// The shortest timeout of the drain request: past the deadline, a zero
/// timeout would fail it before the transfer actor could even answer that
/// nothing is in flight.
constexpr std::chrono::milliseconds min_drain_request{1};
/// How long the contexts may take to end after the last bridge closed its
/// sockets, beyond the PUB sockets' linger (app/context_close.hpp).
constexpr std::chrono::milliseconds context_close_margin{500};

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

/// Time left until `deadline`, never negative.
clock::duration left_until(clock::time_point deadline) {
  return std::max<clock::duration>(deadline - clock::now(), clock::duration::zero());
}

/// Bridges that completed the start-up handshake (only they answer stops).
using ready_set = std::set<caf::actor_addr>;

/// Sends stop to `bridges` and collects the acknowledgements of those that
/// are running; one that dies instead of answering counts as stopped.
bool stop_bridges(caf::scoped_actor& self, const std::vector<bridge_actor>& bridges,
                  const ready_set& ready, supervisor& sup, clock::time_point deadline) {
  std::set<caf::actor_addr> waiting;
  for (auto& b : bridges) {
    self->send(b, stop_atom_v);
    if (ready.count(b.address()) > 0 && !sup.is_down(b.address()))
      waiting.insert(b.address());
  }
  while (!waiting.empty()) {
    if (clock::now() >= deadline)
      return false;
    self->receive(
      [&](stop_atom, const std::string&) { waiting.erase(self->current_sender()->address()); },
      [&](caf::down_msg& dm) {
        sup.on_down(dm);
        waiting.erase(dm.source);
      },
      [&](signal_atom, int) {},
      [&](ready_atom, const std::string&) {},
      [&](failed_atom, const std::string&, const std::string&) {},
      caf::after(left_until(deadline)) >> [] {});
  }
  return true;
}

bool queues_empty(const actor_tree& t) {
  for (auto& q : t.queues)
    if (q->queued() > 0)
      return false;
  return true;
}

/// Waits until the transfer actor has no copy in flight and takes no new
/// one, so that no copy is cut short when the workers exit. Copies still
/// queued have not started: the flag makes the actor refuse them as it
/// reaches them, so shutdown does not wait for a backlog (the drain message
/// cannot overtake what the actor already took from its mailbox).
void drain_copies(caf::scoped_actor& self, const actor_tree& t, supervisor& sup,
                  clock::time_point deadline, const std::string& me) {
  if (t.refuse_copies)
    t.refuse_copies->store(true);
  if (!t.gpu || sup.is_down(t.gpu.address()))
    return;
  auto left = std::max<clock::duration>(left_until(deadline), min_drain_request);
  self->request(t.gpu, left, drain_atom_v)
    .receive(
      [&](uint64_t waited) {
        if (waited > 0)
          KVS_INFO(me, "drained: the {} copies in flight have finished", waited);
      },
      [&](caf::error& err) {
        KVS_WARN(me, "copies still in flight at the drain deadline ({}): the transfer actor "
                     "finishes them before it exits", caf::to_string(err));
      });
}

/// Returns false when a bridge did not acknowledge its stop by `deadline`
/// (its thread is stuck: the process must not wait for it).
bool stop_all(caf::scoped_actor& self, actor_tree& t, const ready_set& ready, supervisor& sup,
              clock::time_point deadline, const std::string& me, bool drain) {
  auto start = clock::now();
  auto drain_deadline = start + (deadline - start) * 6 / 10;
  // 1. Stop taking input.
  bool stopped = stop_bridges(self, t.input_bridges, ready, sup, drain_deadline);
  if (!stopped)
    KVS_WARN(me, "input bridges did not stop in time");
  // 2. Let every copy in flight finish: L1 and the engines' pools stay
  //    mapped until the transfer actor has none left.
  drain_copies(self, t, sup, drain_deadline, me);
  // 3. Drain what was accepted through the publishers to the PUB sockets.
  if (drain) {
    while (!queues_empty(t) && clock::now() < drain_deadline)
      self->receive(caf::after(drain_check_every) >> [] {});
    int64_t left = 0;
    for (auto& q : t.queues)
      left += q->queued();
    if (left > 0)
      KVS_WARN(me, "shutdown deadline reached with {} batches not yet published", left);
    else
      KVS_INFO(me, "drained: every accepted batch was published");
  }
  // 4. Close the outputs (each flushes and closes its sockets on its thread).
  if (!stop_bridges(self, t.output_bridges, ready, sup, deadline)) {
    stopped = false;
    KVS_WARN(me, "output bridges did not stop in time");
  }
  // 5. The rest, at once: the exit goes ahead of whatever is still queued
  // in their mailboxes (after the deadline, a publisher may hold thousands
  // of batches nobody will publish; working through them would keep the
  // process alive past sidecar.shutdown_timeout).
  for (auto& w : t.workers)
    w->enqueue(self->ctrl(), caf::make_message_id(caf::message_priority::high),
               caf::make_message(caf::exit_msg{self->address(), caf::exit_reason::user_shutdown}),
               nullptr);
  return stopped;
}

/// The backstop of sidecar.shutdown_timeout: a bridge whose thread never
/// answered its stop would keep the actor system (and so the process)
/// alive forever. Everything accepted that could be drained was; exit now.
[[noreturn]] void exit_without_stuck_bridges(const std::string& me, int status,
                                             clock::duration timeout) {
  KVS_ERROR(me, "a bridge did not stop within sidecar.shutdown_timeout ({}): exiting without "
                "waiting for it, status {}",
            to_string(timeout), status);
  std::_Exit(status);
}

void watch_tree(caf::scoped_actor& self, supervisor& sup, const actor_tree& t) {
  // The supervisor only monitors them: any handle will do.
  auto watch_all = [&](const auto& group) {
    for (auto& a : group)
      sup.watch(self, caf::actor_cast<caf::actor>(a));
  };
  watch_all(t.input_bridges);
  watch_all(t.output_bridges);
  watch_all(t.workers);
}

} // namespace

void block_signals() {
  auto set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int run_sidecar(const config& cfg) {
  auto me = log::label("sidecar", cfg.sidecar.name, 0);
  // Read by the HTTP health endpoints; written only here.
  health_state& health = kvs::health();
  if (auto files = raise_open_files_limit(); !files)
    KVS_WARN(me, "open files limit not raised: {}", files.error_value().detail);
  else if (files->now != files->before)
    KVS_INFO(me, "open files limit raised from {} to {} (the hard limit, at most 65536): each "
                 "connection takes one", files->before, files->now);
  // Declared before the actor system: destroyed after it, when every bridge
  // has closed its sockets.
  zmq::context_t ctx{1};
  zmq::context_t replay_ctx{1};
  // Named so that the replay bridges can lower its I/O thread's priority
  // (events.replay_nice, actors/thread_priority.hpp).
  replay_ctx.set(zmq::ctxopt::thread_name_prefix, replay_io_thread_prefix);
  // Before anything (the CURVE authoriser too) opens a socket on ctx.
  const int io_nice = static_cast<int>(cfg.sidecar.io_nice);
  if (auto err = start_context_threads_at_nice(ctx, io_nice))
    KVS_INFO(me, "sidecar.io_nice = {} not applied ({}; a value below the process's needs "
                 "CAP_SYS_NICE): the ZeroMQ I/O thread runs at the process's priority",
             io_nice, *err);
  else if (io_nice != 0)
    KVS_INFO(me, "ZeroMQ I/O thread at nice {} (sidecar.io_nice)", io_nice);
  // The ZAP handler (connection limits; CURVE) runs before any bridge binds
  // and is stopped after every bridge closed its sockets, before the
  // contexts end.
  std::optional<zap_handler> zap;
  zap.emplace(std::vector<zmq::context_t*>{&ctx, &replay_ctx}, cfg.security.curve_allowed_keys);
  if (auto err = zap->start()) {
    KVS_ERROR(me, "start-up failed: {}", *err);
    return exit_startup_failed;
  }
  if (cfg.security.curve_enabled()) {
    KVS_INFO(me, "CURVE on events.endpoint, events.replay_endpoint and cache.endpoint "
                 "(security.curve_secret_key_file = \"{}\", {} allowed clients in \"{}\")",
             cfg.security.curve_secret_key_file, cfg.security.curve_allowed_keys.size(),
             cfg.security.curve_allowed_clients_dir);
  }
  caf::actor_system_config sys_cfg;
  sys_cfg.set("scheduler.max-threads", static_cast<size_t>(scheduler_threads(cfg)));
  // One shared queue whose idle workers block on a condition variable and
  // are woken by the next message. CAF's default work stealing polls in
  // 50 us sleeps for a while after each message, which on a sidecar's small
  // CPU share doubled the cache server's request round trip (BENCHMARKS.md).
  sys_cfg.set("scheduler.policy", caf::atom("sharing"));
  int status = exit_ok;
  {
    caf::actor_system sys{sys_cfg};
    caf::scoped_actor self{sys};
    KVS_INFO(me, "starting: events {}, cache {}, gpu backend \"{}\", {} worker thread(s)",
             cfg.events.enabled ? "on" : "off", cfg.cache.enabled ? "on" : "off",
             to_string(cfg.gpu.backend), scheduler_threads(cfg));
    auto obs = start_observability(sys, cfg, me);
    if (!obs.error.empty()) {
      KVS_ERROR(me, "start-up failed: {}", obs.error);
      KVS_INFO(me, "exited with status {}", exit_startup_failed);
      return exit_startup_failed;
    }
    // Made before the tree (the L2 actor reports into it), handed its
    // instance id by the membership once registered.
    std::shared_ptr<coordinator_events> reporter;
    if (cfg.coordinator.event_reporting) {
      std::vector<declared_capacity> capacity;
      // L1 first, as LMCache's CapacitySnapshot lists its L1 medium first.
      if (cfg.cache.enabled)
        capacity.push_back({"dram", false, cfg.cache.l1_size, true});
      if (cfg.l2.disk.enabled)
        capacity.push_back({"fs", false, cfg.l2.disk.size});
      if (cfg.l2.redis.enabled)
        capacity.push_back({"resp", true, 0});
      reporter = std::make_shared<coordinator_events>(
        cfg.coordinator.url, cfg.coordinator.instance_id,
        std::chrono::duration_cast<std::chrono::milliseconds>(cfg.coordinator.event_flush_interval),
        static_cast<size_t>(cfg.coordinator.event_queue_max), std::move(capacity), me);
    }
    auto tree = spawn_actor_tree(sys, ctx, replay_ctx, cfg, self, reporter);
    supervisor sup;
    watch_tree(self, sup, tree);
    // Signals arrive as messages: the first one starts the shutdown; during
    // it a second SIGINT (Ctrl-C twice) ends the process at once, while a
    // repeated SIGTERM (orchestrators resend it) does not cut the drain.
    std::atomic<int> signals_seen{0};
    signal_watcher signals{[&, target = caf::actor_cast<caf::actor>(self)](int sig) {
      if (signals_seen.fetch_add(1) == 0) {
        // /readyz answers 503 from here on, before the line below says so
        // (a router must not be told "ready" after the signal was logged).
        health.draining = true;
        // Logged here, on arrival: a second SIGINT right behind it exits
        // before the main thread would get to log it.
        KVS_INFO(me, "{} received: stopping input, draining, closing sockets (deadline {})",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", to_string(cfg.sidecar.shutdown_timeout));
        caf::anon_send(target, signal_atom_v, sig);
      } else if (sig == SIGINT) {
        KVS_WARN(me, "second SIGINT during shutdown: exiting now");
        std::_Exit(130);
      } else {
        KVS_INFO(me, "SIGTERM again: already shutting down");
      }
    }};
    std::vector<std::string> failures;
    if (!signals.error().empty())
      failures.push_back(signals.error());
    watch_actors(obs, tree);
    // Start-up handshake: every bridge reports ready or why it failed.
    ready_set ready;
    int early_signal = 0;
    auto deadline = clock::now() + startup_timeout;
    while (ready.size() + failures.size() < tree.bridge_count() && clock::now() < deadline
           && early_signal == 0) {
      self->receive([&](ready_atom, const std::string&) {
                      ready.insert(self->current_sender()->address());
                    },
                    [&](failed_atom, const std::string& who, const std::string& why) {
                      failures.push_back(who + ": " + why);
                    },
                    [&](caf::down_msg& dm) { sup.on_down(dm); },
                    [&](signal_atom, int sig) { early_signal = sig; },
                    caf::after(left_until(deadline)) >> [] {});
    }
    if (!tree.error.empty())
      failures.push_back(tree.error);
    if (early_signal == 0 && ready.size() + failures.size() < tree.bridge_count())
      failures.push_back("bridges did not report ready within "
                         + std::to_string(startup_timeout.count()) + "s");
    if (failures.empty() && sup.first_down())
      failures.push_back(sup.first_down()->name + " exited during start-up: "
                         + sup.first_down()->reason_text());
    if (!failures.empty()) {
      health.draining = true; // the stops below are expected exits
      for (auto& f : failures)
        KVS_ERROR(me, "start-up failed: {}", f);
      stop_all(self, tree, ready, sup, clock::now() + failed_startup_stop_timeout, me, false);
      status = exit_startup_failed;
    } else {
      stop_cause cause;
      cause.signal = early_signal;
      if (cause.signal == 0) {
        for (auto& line : tree.summary)
          KVS_INFO(me, "actor tree: {}", line);
        health.ready = true;
        KVS_INFO(me, "kvsidecar ready ({} bridges, {} actors, {} supervised)",
                 tree.bridge_count(), tree.workers.size(), sup.watched());
        // Thresholds of 32 MiB: well above what the idle sidecar frees and
        // reuses, well below what a flood of clients leaves behind.
        memory_trimmer trimmer{uint64_t{32} << 20, me};
        // Joins the fleet once ready; leaves it first thing at shutdown.
        auto member = coordinator_member::start(
          cfg.coordinator,
          static_cast<uint16_t>(std::stoi(cfg.http.listen.substr(cfg.http.listen.rfind(':') + 1))),
          me, reporter);
        cause = wait_for_stop(self, sup, [&] { trimmer.tick(); });
        member.reset();
      }
      health.ready = false;
      if (cause.down) {
        health.alive = false;
        KVS_ERROR(me, "{} exited unexpectedly ({}): shutting down, exit status {} (restart me)",
                  cause.down->name, cause.down->reason_text(), int{exit_actor_failed});
        status = exit_actor_failed;
      } // else a signal: the watcher set draining when it arrived
      if (!stop_all(self, tree, ready, sup, clock::now() + cfg.sidecar.shutdown_timeout, me,
                    true))
        exit_without_stuck_bridges(me, status, cfg.sidecar.shutdown_timeout);
    }
  }
  if (zap)
    zap->stop();
  // Every socket is closed; only the PUB sockets' linger may still run.
  if (!close_contexts_until({&replay_ctx, &ctx},
                            clock::now() + pub_linger(cfg) + context_close_margin)) {
    KVS_WARN(me, "ZeroMQ did not finish closing its contexts within {} of the last socket's "
                 "close (a libzmq wait; every socket was closed): exiting without it",
             to_string(pub_linger(cfg) + context_close_margin));
    KVS_INFO(me, "exited with status {}", status);
    std::_Exit(status); // the contexts are still in use by the closing thread
  }
  KVS_INFO(me, "exited with status {}", status);
  return status;
}

} // namespace kvs
