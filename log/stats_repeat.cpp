#include "log/stats_repeat.hpp"

#include <mutex>
#include <unordered_map>

namespace kvs::log {

namespace {

struct last_line {
  std::string line;
  std::chrono::steady_clock::time_point at;
};

struct repeat_filter {
  std::mutex mu;
  std::chrono::nanoseconds repeat{0};
  /// One entry per actor label: as many as long-lived actors (a few dozen).
  std::unordered_map<std::string, last_line> last;
};

repeat_filter& filter() {
  static repeat_filter f;
  return f;
}

} // namespace

void set_stats_repeat(std::chrono::nanoseconds repeat) {
  auto& f = filter();
  std::lock_guard<std::mutex> guard{f.mu};
  f.repeat = repeat;
}

bool stats_line_due(std::string_view actor, std::string_view line,
                    std::chrono::steady_clock::time_point now) {
  auto& f = filter();
  std::lock_guard<std::mutex> guard{f.mu};
  if (f.repeat.count() <= 0)
    return true;
  auto [it, fresh] = f.last.try_emplace(std::string{actor});
  if (!fresh && it->second.line == line && now - it->second.at < f.repeat)
    return false;
  it->second.line.assign(line);
  it->second.at = now;
  return true;
}

} // namespace kvs::log
