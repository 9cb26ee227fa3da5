// Turns actors' stats snapshots into Prometheus metric families.
#pragma once

#include "messages/stats_snapshot.hpp"

#include <prometheus/metric_family.h>

#include <vector>

namespace kvs {

/// One family per metric name, in the order names first appear; each value
/// carries its snapshot's labels plus its own. HELP comes from the catalog
/// (metrics/catalog.hpp); an undocumented family says so in its HELP.
/// Values with no metric name (log-only) are left out.
std::vector<prometheus::MetricFamily> to_families(const std::vector<stats_snapshot>& snaps);

} // namespace kvs
