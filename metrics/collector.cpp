#include "metrics/collector.hpp"

#include "core/version.hpp"
#include "metrics/health.hpp"
#include "messages/type_ids.hpp"
#include "metrics/families.hpp"
#include "metrics/coordinator_calls.hpp"
#include "metrics/process_stats.hpp"

#include <caf/actor_cast.hpp>
#include <caf/monitorable_actor.hpp>
#include <caf/scoped_actor.hpp>

namespace kvs {

namespace {

/// How a scrape timeout names an actor: its log label without the "#id"
/// ("publisher[dp=0]", "l2"), stable across restarts of the sidecar; before
/// its first answer, the actor's own name.
std::string timeout_label(const stats_client_actor& a, const stats_snapshot* last) {
  if (last && !last->actor.empty())
    return last->actor.substr(0, last->actor.rfind('#'));
  auto* p = dynamic_cast<caf::monitorable_actor*>(caf::actor_cast<caf::abstract_actor*>(a));
  return p ? std::string{p->name()} : "actor#" + std::to_string(a.id());
}

} // namespace

stats_collector::stats_collector(caf::actor_system& sys, std::chrono::milliseconds timeout)
  : sys_(sys), timeout_(timeout) {}

void stats_collector::watch(std::vector<stats_client_actor> actors) {
  std::lock_guard<std::mutex> guard{mu_};
  targets_ = std::move(actors);
}

std::vector<stats_snapshot> stats_collector::ask() const {
  using clock = std::chrono::steady_clock;
  std::map<caf::actor_id, stats_snapshot> fresh;
  {
    // A fresh scoped actor per scrape: a late answer to an earlier scrape
    // can never be mistaken for this one's.
    caf::scoped_actor self{sys_};
    auto me = caf::actor_cast<caf::actor>(self);
    for (auto& t : targets_)
      self->send(t, metrics_atom_v, me);
    auto deadline = clock::now() + timeout_;
    while (fresh.size() < targets_.size()) {
      auto left = deadline - clock::now();
      if (left <= clock::duration::zero())
        break;
      self->receive([&](stats_snapshot& s) { fresh[s.actor_id] = std::move(s); },
                    caf::after(left) >> [] {});
    }
  }
  std::vector<stats_snapshot> out;
  for (auto& t : targets_) {
    auto id = t.id();
    if (auto i = fresh.find(id); i != fresh.end()) {
      last_[id] = i->second;
      out.push_back(std::move(i->second));
    } else if (auto j = last_.find(id); j != last_.end()) {
      ++timeouts_[timeout_label(t, &j->second)];
      out.push_back(j->second);
    } else {
      ++timeouts_[timeout_label(t, nullptr)];
    }
  }
  return out;
}

stats_snapshot stats_collector::process_snapshot() const {
  stats_snapshot s;
  auto& h = health();
  s.gauge("", "kvsidecar_up", 1)
    .gauge("", "kvsidecar_ready", h.ready.load() && !h.draining.load() ? 1 : 0)
    .gauge("", "kvsidecar_uptime_seconds", uptime_seconds())
    .gauge("", "kvsidecar_build_info", 1, "version", kvs::version)
    .gauge("", "process_resident_memory_bytes", static_cast<double>(resident_bytes()))
    .gauge("", "process_start_time_seconds", start_time_seconds());
  if (auto& c = coordinator_calls(); c.joined.load()) {
    s.counter("", "kvsidecar_coordinator_calls_failed_total",
              static_cast<double>(c.registering.load()), "call", "register")
      .counter("", "kvsidecar_coordinator_calls_failed_total",
               static_cast<double>(c.heartbeat.load()), "call", "heartbeat")
      .counter("", "kvsidecar_coordinator_calls_failed_total",
               static_cast<double>(c.deregistering.load()), "call", "deregister");
  }
  for (auto& [actor, n] : timeouts_)
    s.counter("", "kvsidecar_scrape_timeouts_total", static_cast<double>(n), "actor", actor);
  return s;
}

std::vector<prometheus::MetricFamily> stats_collector::Collect() const {
  std::lock_guard<std::mutex> guard{mu_};
  auto snaps = ask();
  snaps.push_back(process_snapshot());
  return to_families(snaps);
}

} // namespace kvs
