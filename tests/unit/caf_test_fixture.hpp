// An actor system on CAF's deterministic test scheduler: messages are
// delivered only when a test runs the scheduler (sched.run(), run_once(),
// trigger_timeouts()), so actor tests need no wall-clock waits.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>

namespace kvs::test {

struct caf_test_fixture {
  static caf::actor_system_config& init(caf::actor_system_config& cfg) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    return cfg;
  }
  caf::actor_system_config sys_cfg;
  caf::actor_system sys{init(sys_cfg)};
  caf::scheduler::test_coordinator& sched =
    dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
};

} // namespace kvs::test
