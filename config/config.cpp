// The config's vocabulary (sizes, durations, endpoints) and its loading:
// defaults, then the file, then --set overrides, then each section read and
// checked by its own file (config/section_*.cpp, through config_reader.hpp).
#include "config/config.hpp"

#include "config/config_reader.hpp"
#include "core/listen_address.hpp"
#include "core/text_file.hpp"

#include <toml++/toml.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

namespace kvs {

using config_detail::config_error;
using config_detail::loader;
using config_detail::reader;
using config_detail::tcp_port;
using config_detail::trim;

// -- units ---------------------------------------------------------------------

namespace {

// Splits "512MiB" into 512 and "MiB"; false when there is no leading number.
bool split_number(std::string_view text, double& number, std::string_view& unit) {
  text = trim(text);
  size_t i = 0;
  bool digits = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    digits |= std::isdigit(static_cast<unsigned char>(text[i])) != 0;
    ++i;
  }
  if (!digits)
    return false;
  try {
    size_t used = 0;
    number = std::stod(std::string{text.substr(0, i)}, &used);
    if (used != i)
      return false;
  } catch (...) {
    return false;
  }
  unit = trim(text.substr(i));
  return std::isfinite(number) && number >= 0;
}

} // namespace

std::optional<uint64_t> parse_size(std::string_view text) {
  double n = 0;
  std::string_view unit;
  if (!split_number(text, n, unit))
    return std::nullopt;
  static const std::pair<std::string_view, double> units[] = {
    {"", 1},         {"B", 1},
    {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024},
    {"TiB", 1024.0 * 1024 * 1024 * 1024},
    {"KB", 1e3},     {"MB", 1e6},            {"GB", 1e9}, {"TB", 1e12},
  };
  for (auto& [name, factor] : units) {
    if (unit == name) {
      double bytes = n * factor;
      if (bytes > 1.8e19 || bytes != std::floor(bytes))
        return std::nullopt;
      return static_cast<uint64_t>(bytes);
    }
  }
  return std::nullopt;
}

std::optional<duration> parse_duration(std::string_view text) {
  double n = 0;
  std::string_view unit;
  if (!split_number(text, n, unit))
    return std::nullopt;
  static const std::pair<std::string_view, double> units[] = {
    {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}, {"m", 60e9}, {"h", 3600e9},
  };
  for (auto& [name, factor] : units)
    if (unit == name) {
      double ns = n * factor;
      if (ns > 9e18)
        return std::nullopt;
      return duration{static_cast<int64_t>(ns)};
    }
  return std::nullopt;
}

int64_t scheduler_threads(const config& c) {
  if (c.sidecar.worker_threads > 0)
    return c.sidecar.worker_threads;
  // One thread unless the store copies L2 fetches into L1 (on a scheduler
  // thread): a second one keeps the other sessions moving meanwhile.
  return c.cache.enabled && c.l2.enabled() ? 2 : 1;
}

std::string to_string(duration d) {
  auto ns = d.count();
  if (ns == 0)
    return "0s";
  if (ns % 1000000000 == 0)
    return std::to_string(ns / 1000000000) + "s";
  if (ns % 1000000 == 0)
    return std::to_string(ns / 1000000) + "ms";
  if (ns % 1000 == 0)
    return std::to_string(ns / 1000) + "us";
  return std::to_string(ns) + "ns";
}

// -- endpoints -----------------------------------------------------------------

bool endpoint_binds(const std::string& ep) {
  return ep.find('*') != std::string::npos || ep.find("::") != std::string::npos
         || ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0;
}

bool endpoint_is_local(const std::string& ep) {
  if (ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0)
    return true;
  if (ep.rfind("tcp://", 0) != 0)
    return false;
  auto colon = ep.rfind(':');
  auto host = ep.substr(6, colon == std::string::npos || colon < 6 ? std::string::npos : colon - 6);
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "::1";
}

status check_listen_address(const std::string& s) {
  auto a = parse_listen_address(s);
  if (!a)
    return make_error("bad_value", "expected " + a.error_value().detail
                                     + " (like \"0.0.0.0:9090\"), got \"" + s + "\"");
  return {};
}

status check_grpc_endpoint(const std::string& ep) {
  if (ep.empty())
    return {};
  if (ep.rfind("grpc+unix://", 0) == 0) {
    auto path = ep.substr(12);
    if (path.size() < 2 || path[0] != '/')
      return make_error("bad_value", "expected an absolute socket path after grpc+unix:// (like "
                                     "\"grpc+unix:///run/kvsidecar/lmcache.sock\"), got \"" + ep + "\"");
    if (path.size() > 107)
      return make_error("bad_value", "socket path longer than 107 bytes (sun_path): \"" + ep + "\"");
    return {};
  }
  if (ep.rfind("grpc://", 0) == 0) {
    auto port = tcp_port("tcp://" + ep.substr(7));
    auto colon = ep.rfind(':');
    if (port < 0 || port > 65535 || colon <= 7)
      return make_error("bad_value", "expected grpc://host:port (like \"grpc://127.0.0.1:5556\"), got \""
                                     + ep + "\"");
    return {};
  }
  return make_error("bad_value", "expected \"\" (off), grpc://host:port or grpc+unix:///path, got \""
                                 + ep + "\"");
}

expected<std::string> offset_endpoint(const std::string& ep, int64_t rank) {
  if (ep.empty() || rank == 0)
    return ep;
  if (ep.rfind("inproc://", 0) == 0 || ep.rfind("ipc://", 0) == 0)
    return ep + "_dp" + std::to_string(rank);
  if (ep.rfind("tcp://", 0) == 0) {
    auto port = tcp_port(ep);
    if (port < 0)
      return make_error("bad_value", "tcp endpoint without a numeric port");
    if (port == 0)
      return ep; // ephemeral: every rank gets its own anyway
    if (port + rank > 65535)
      return make_error("bad_value", "port " + std::to_string(port) + " + dp rank " + std::to_string(rank)
                                         + " exceeds 65535");
    return ep.substr(0, ep.rfind(':') + 1) + std::to_string(port + rank);
  }
  return make_error("bad_value", "endpoint must be tcp://, ipc:// or inproc://");
}

const char* to_string(l1_prefault_mode p) {
  switch (p) {
    case l1_prefault_mode::off: return "off";
    case l1_prefault_mode::start: return "start";
    case l1_prefault_mode::background: return "background";
    case l1_prefault_mode::ahead: return "ahead";
  }
  return "?";
}

const char* to_string(gpu_backend b) {
  switch (b) {
    case gpu_backend::automatic: return "auto";
    case gpu_backend::cuda: return "cuda";
    case gpu_backend::host: return "host";
  }
  return "?";
}

// -- loading -------------------------------------------------------------------

namespace {

// Every load error but an unreadable file is kind "config"; the detail is
// the one line main() prints.
error to_error(const config_error& e) { return make_error("config", e.to_string()); }

/// The merged TOML as JSON for GET /config, with every secret's value
/// replaced by "<redacted>" (whether set or not, so its length does not show).
std::string effective_config_json(toml::table t) {
  for (const char* secret : {"l2.redis.password", "http.admin_token"}) {
    auto dot = std::string_view{secret}.rfind('.');
    auto parent = std::string{std::string_view{secret}.substr(0, dot)};
    if (auto* tbl = t.at_path(parent).as_table())
      tbl->insert_or_assign(std::string{std::string_view{secret}.substr(dot + 1)}, "<redacted>");
  }
  std::ostringstream os;
  os << toml::json_formatter{t};
  return os.str();
}

expected<config> finish(const toml::table& t, loader& l) {
  config c;
  reader r{t, l};
  // In this order: each section may check itself against an earlier one.
  read_sidecar_section(r, l, c);
  read_events_section(r, l, c);
  read_cache_section(r, l, c);
  read_security_section(r, l, c);
  read_l2_section(r, l, c);
  read_control_section(r, l, c);
  read_coordinator_section(r, l, c);
  if (l.error)
    return to_error(*l.error);
  c.effective_json = effective_config_json(t);
  return c;
}

} // namespace

expected<config> load_config_text(std::string_view text, const std::string& source,
                                  const std::vector<std::string>& overrides) {
  loader l;
  toml::table t;
  if (!l.parse_into(t, default_config_toml, "<default>", true))
    return to_error(*l.error);
  if (!text.empty() && !l.parse_into(t, text, source, false))
    return to_error(*l.error);
  for (auto& kv : overrides)
    if (!l.apply_override(t, kv))
      return to_error(*l.error);
  return finish(t, l);
}

expected<config> load_config(const std::string& file, const std::vector<std::string>& overrides) {
  if (file.empty())
    return load_config_text({}, "<default>", overrides);
  auto read = read_text_file(file);
  if (!read)
    return make_error("io", config_error{file, "", 0, "cannot read the file"}.to_string());
  auto text = std::move(*read);
  if (text.empty())
    text = "\n"; // an empty file is a valid config: all defaults
  return load_config_text(text, file, overrides);
}

} // namespace kvs
