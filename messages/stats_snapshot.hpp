// stats_snapshot: what an actor reports about itself, in one place.
//
// Every long-lived actor builds one from its own counters, for two readers:
// its periodic `stats:` log line (line()) and the /metrics endpoint (the
// collector in metrics/ asks each actor with `metrics_atom` on a scrape). One
// source, so the log and the metrics never disagree, and the hot paths only
// ever touch the plain counters they already had.
#pragma once

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvs {

/// One value. `metric` is the Prometheus family it feeds ("" = log only),
/// with at most one label of its own (e.g. reason="queue_full") on top of
/// the snapshot's labels. `text` values are log only ("3..5").
struct stat_value {
  enum class kind : uint8_t { counter, gauge };
  std::string key; ///< name in the stats log line
  std::string metric;
  kind type = kind::counter;
  double value = 0;
  std::string label_name;
  std::string label_value;
  std::string text;
};

/// A fixed-bucket histogram kept in an actor's state: observe() is a short
/// scan of the bounds and two adds, cheap enough for every request.
template <size_t N>
struct fixed_histogram {
  const std::array<double, N>* bounds = nullptr; ///< upper bounds, ascending
  std::array<uint64_t, N + 1> counts{};          ///< last one: above every bound
  double sum = 0;
  uint64_t count = 0;

  void observe(double v) {
    size_t i = 0;
    while (i < N && v > (*bounds)[i])
      ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

/// A histogram as exported: cumulative later (the collector does that).
struct stat_histogram {
  std::string metric;
  std::string label_name;
  std::string label_value;
  std::vector<double> bounds;
  std::vector<uint64_t> counts; ///< per bucket, bounds.size() + 1 of them
  double sum = 0;
  uint64_t count = 0;
};

struct stats_snapshot {
  std::string actor; ///< the actor's log label, "publisher[dp=0]#8"
  uint64_t actor_id = 0; ///< who answered (replies are anonymous messages)
  std::vector<std::pair<std::string, std::string>> labels; ///< {"dp_rank", "0"}
  std::vector<stat_value> values;
  std::vector<stat_histogram> histograms;

  stats_snapshot& counter(std::string key, std::string metric, double v,
                          std::string label_name = {}, std::string label_value = {}) {
    values.push_back({std::move(key), std::move(metric), stat_value::kind::counter, v,
                      std::move(label_name), std::move(label_value), {}});
    return *this;
  }
  stats_snapshot& gauge(std::string key, std::string metric, double v,
                        std::string label_name = {}, std::string label_value = {}) {
    values.push_back({std::move(key), std::move(metric), stat_value::kind::gauge, v,
                      std::move(label_name), std::move(label_value), {}});
    return *this;
  }
  /// Log only: a number the metrics carry elsewhere, or not at all.
  stats_snapshot& log_only(std::string key, double v) {
    values.push_back({std::move(key), {}, stat_value::kind::gauge, v, {}, {}, {}});
    return *this;
  }
  stats_snapshot& log_text(std::string key, std::string text) {
    values.push_back({std::move(key), {}, stat_value::kind::gauge, 0, {}, {}, std::move(text)});
    return *this;
  }
  template <size_t N>
  stats_snapshot& histogram(std::string metric, const fixed_histogram<N>& h,
                            std::string label_name = {}, std::string label_value = {}) {
    stat_histogram out{std::move(metric), std::move(label_name), std::move(label_value),
                       {}, {}, h.sum, h.count};
    if (h.bounds)
      out.bounds.assign(h.bounds->begin(), h.bounds->end());
    out.counts.assign(h.counts.begin(), h.counts.end());
    histograms.push_back(std::move(out));
    return *this;
  }

  /// "received=12 published=12 ..." in the order the values were added.
  std::string line() const {
    std::string out;
    for (auto& v : values) {
      if (v.key.empty())
        continue;
      if (!out.empty())
        out += ' ';
      out += v.key;
      out += '=';
      if (!v.text.empty())
        out += v.text;
      else if (v.value == std::floor(v.value) && std::fabs(v.value) < 9.0e15)
        out += std::to_string(static_cast<int64_t>(v.value));
      else {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.6g", v.value);
        out += buf;
      }
    }
    return out;
  }
};

} // namespace kvs
