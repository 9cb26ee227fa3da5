// [sidecar], [gpu] and [http]: the process, its transfer backend, its probes.
#include "config/config_reader.hpp"

namespace kvs::config_detail {

void read_sidecar_section(reader& r, loader& l, config& c) {
  c.sidecar.name = r.str("sidecar.name");
  if (c.sidecar.name.empty())
    l.fail_at("sidecar.name", "expected a non-empty name");
  c.sidecar.log_level = r.one_of<log::level>(
    "sidecar.log_level", {{"trace", log::level::trace}, {"debug", log::level::debug},
                          {"info", log::level::info}, {"warn", log::level::warn},
                          {"error", log::level::error}});
  c.sidecar.log_format = r.one_of<log::format>(
    "sidecar.log_format", {{"text", log::format::text}, {"json", log::format::json}});
  c.sidecar.stats_interval = r.dur("sidecar.stats_interval", true);
  c.sidecar.stats_repeat = r.dur("sidecar.stats_repeat", true);
  c.sidecar.shutdown_timeout = r.dur("sidecar.shutdown_timeout", false);
  c.sidecar.worker_threads = r.integer("sidecar.worker_threads", 0, 64);
  c.sidecar.io_nice = r.integer("sidecar.io_nice", -20, 0);

  c.gpu.backend = r.one_of<gpu_backend>(
    "gpu.backend",
    {{"auto", gpu_backend::automatic}, {"cuda", gpu_backend::cuda}, {"host", gpu_backend::host}});
  c.gpu.host_prefault = r.boolean("gpu.host_prefault");
  c.gpu.host_copy_threads = r.integer("gpu.host_copy_threads", 1, 16);

  c.http.enabled = r.boolean("http.enabled");
  c.http.listen = r.str("http.listen");
  if (auto ok = check_listen_address(c.http.listen); !ok && !l.error)
    l.fail_at("http.listen", ok.error_value().detail);
}

} // namespace kvs::config_detail
