// Names the calling thread after the actor it runs.
//
// CAF names every detached actor's thread "caf.actor"; renamed, `top -H`,
// `perf` and /proc/<pid>/task/*/comm show which bridge or indexer a thread
// is (tests/bench/relay_cpu_split.sh reports CPU per thread by these
// names). Linux keeps 15 characters. A rank's actor is "<name>:<rank>"
// ("ingest:0", "pub:0", "replay_bridge:0", "index:0").
#pragma once

#include <pthread.h>

#include <string>

namespace kvs {

inline void name_this_thread(std::string name) {
  if (name.size() > 15)
    name.resize(15);
  pthread_setname_np(pthread_self(), name.c_str());
}

/// The thread name of an actor logged as `name[detail]`: "<name>:<rank>"
/// for a rank's actor (detail "dp=<rank>"), the bare name otherwise.
inline std::string actor_thread_name(const std::string& name, const std::string& detail) {
  return detail.rfind("dp=", 0) == 0 ? name + ":" + detail.substr(3) : name;
}

} // namespace kvs
