#include "metrics/families.hpp"

#include "metrics/catalog.hpp"

#include <limits>
#include <map>

namespace kvs {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

class family_set {
public:
  MetricFamily& get(const std::string& name, MetricType type) {
    auto [it, fresh] = index_.emplace(name, families_.size());
    if (fresh) {
      MetricFamily f;
      f.name = name;
      f.type = type;
      auto* info = find_metric(name);
      f.help = info ? std::string{info->help} : std::string{"(undocumented)"};
      families_.push_back(std::move(f));
    }
    return families_[it->second];
  }
  std::vector<MetricFamily> take() {
    return std::move(families_);
  }

private:
  std::map<std::string, size_t> index_;
  std::vector<MetricFamily> families_;
};

std::vector<ClientMetric::Label> labels_of(const stats_snapshot& s, const std::string& name,
                                           const std::string& value) {
  std::vector<ClientMetric::Label> out;
  for (auto& [k, v] : s.labels)
    out.push_back({k, v});
  if (!name.empty())
    out.push_back({name, value});
  return out;
}

} // namespace

std::vector<MetricFamily> to_families(const std::vector<stats_snapshot>& snaps) {
  family_set set;
  for (auto& s : snaps) {
    for (auto& v : s.values) {
      if (v.metric.empty() || !v.text.empty())
        continue;
      bool counter = v.type == stat_value::kind::counter;
      auto& f = set.get(v.metric, counter ? MetricType::Counter : MetricType::Gauge);
      ClientMetric m;
      m.label = labels_of(s, v.label_name, v.label_value);
      (counter ? m.counter.value : m.gauge.value) = v.value;
      f.metric.push_back(std::move(m));
    }
    for (auto& h : s.histograms) {
      auto& f = set.get(h.metric, MetricType::Histogram);
      ClientMetric m;
      m.label = labels_of(s, h.label_name, h.label_value);
      m.histogram.sample_count = h.count;
      m.histogram.sample_sum = h.sum;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h.counts.size(); ++i) {
        cumulative += h.counts[i];
        double bound = i < h.bounds.size() ? h.bounds[i]
                                           : std::numeric_limits<double>::infinity();
        m.histogram.bucket.push_back({cumulative, bound});
      }
      f.metric.push_back(std::move(m));
    }
  }
  return set.take();
}

} // namespace kvs
