// Every Prometheus metric family kvsidecar exports, with its help text.
//
// Actors name the family of each value in their stats_snapshot; this table
// is where the families are documented (the README's metrics list follows
// it), and the collector takes each family's HELP from here.
#pragma once

#include <string_view>

namespace kvs {

struct metric_info {
  std::string_view name;
  std::string_view help;
};

/// The family called `name`, or nullptr when it is not documented.
const metric_info* find_metric(std::string_view name);

} // namespace kvs
