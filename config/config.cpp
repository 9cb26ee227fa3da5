#include "config/config.hpp"

#include "config/curve_keys.hpp"
#include "core/listen_address.hpp"
#include "core/text_file.hpp"

#include <toml++/toml.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <tuple>
#include <sstream>

namespace kvs {

// -- units ---------------------------------------------------------------------

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

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
  return c.cache.enabled ? 2 : 1;
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

namespace {

// Parses the port of a tcp endpoint; -1 when there is none or it is not a number.
long tcp_port(const std::string& ep) {
  auto colon = ep.rfind(':');
  if (colon == std::string::npos || colon + 1 >= ep.size() || colon < 6)
    return -1;
  auto digits = ep.substr(colon + 1);
  if (digits.size() > 6)
    return -1;
  for (char c : digits)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return -1;
  return std::stol(digits);
}

} // namespace

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

/// The first problem found while loading, before it becomes a kvs::error.
struct config_error {
  std::string source; ///< file name, "<default>" or "--set"
  std::string key;    ///< "events.endpoint"
  int64_t line = 0;   ///< 0 when unknown
  std::string what;   ///< "expected a port in 1..65535, got 70000"

  /// "config error: <source>[:<line>][: key '<key>']: <what>"
  std::string to_string() const {
    std::ostringstream os;
    os << "config error: " << source;
    if (line > 0)
      os << ":" << line;
    if (!key.empty())
      os << ": key '" << key << "'";
    os << ": " << what;
    return os.str();
  }
};

// Where a key's final value came from, for error messages.
struct origin {
  std::string source;
  int64_t line = 0;
};

class loader {
public:
  std::optional<config_error> error;

  bool parse_into(toml::table& dst, std::string_view text, const std::string& source,
                  bool is_default) {
    toml::table src;
    try {
      src = toml::parse(text, source);
    } catch (const toml::parse_error& e) {
      fail(source, "", static_cast<int64_t>(e.source().begin.line),
           std::string{"not valid TOML: "} + std::string{e.description()});
      return false;
    }
    return merge(dst, src, source, is_default);
  }

  bool apply_override(toml::table& dst, const std::string& kv) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) {
      fail("--set", kv, 0, "expected section.key=value");
      return false;
    }
    auto key = std::string{trim(std::string_view{kv}.substr(0, eq))};
    auto value = std::string{trim(std::string_view{kv}.substr(eq + 1))};
    auto dot = key.rfind('.');
    if (dot == std::string::npos || key.find('.') == 0 || dot + 1 == key.size()) {
      fail("--set", key, 0, "expected section.key=value");
      return false;
    }
    // A TOML value when it parses as one; otherwise a bare string, so that
    // `--set events.endpoint=tcp://*:5600` works without shell-quoted quotes.
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      parsed = toml::table{};
      parsed.insert("v", value);
    }
    // "l2.redis.ttl" -> {l2 = {redis = {ttl = v}}}
    toml::table wrapper;
    wrapper.insert(key.substr(dot + 1), *parsed.get("v"));
    for (auto end = dot; end != std::string::npos;) {
      auto start = key.rfind('.', end - 1);
      auto name = key.substr(start == std::string::npos ? 0 : start + 1,
                             end - (start == std::string::npos ? 0 : start + 1));
      toml::table outer;
      outer.insert(name, std::move(wrapper));
      wrapper = std::move(outer);
      end = start;
    }
    return merge(dst, wrapper, "--set", false);
  }

  const origin& where(const std::string& key) const {
    static const origin none{"<default>", 0};
    auto i = origins_.find(key);
    return i == origins_.end() ? none : i->second;
  }

  void fail(const std::string& source, const std::string& key, int64_t line,
            std::string what) {
    if (!error)
      error = config_error{source, key, line, std::move(what)};
  }

  void fail_at(const std::string& key, std::string what) {
    auto& o = where(key);
    fail(o.source, key, o.line, std::move(what));
  }

private:
  std::map<std::string, origin> origins_;

  static const char* type_name(const toml::node& n) {
    switch (n.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a float";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::table: return "a table";
      case toml::node_type::array: return "an array";
      default: return "a date/time";
    }
  }

  bool merge(toml::table& dst, toml::table& src, const std::string& source,
             bool is_default) {
    for (auto&& [skey, snode] : src) {
      std::string section{skey.str()};
      auto line = static_cast<int64_t>(snode.source().begin.line);
      if (!snode.as_table()) {
        fail(source, section, line,
             "top-level keys must be sections: [sidecar], [events], [cache], [gpu], [security], [http], [l2]");
        return false;
      }
      if (!is_default && !dst.get_as<toml::table>(section)) {
        fail(source, section, line, "unknown section (expected sidecar, events, cache, gpu, security, http or l2)");
        return false;
      }
      if (!merge_table(dst, section, *snode.as_table(), section, source, is_default))
        return false;
    }
    return true;
  }

  /// Merges src into dst[name] key by key; subtables ([l2.disk]) recurse, so
  /// a file that sets one key of a subtable keeps the defaults of the others.
  bool merge_table(toml::table& parent, const std::string& name, toml::table& src,
                   const std::string& path, const std::string& source, bool is_default) {
    auto* dtbl = parent.get_as<toml::table>(name);
    if (!dtbl) {
      parent.insert(name, toml::table{});
      dtbl = parent.get_as<toml::table>(name);
    }
    for (auto&& [k, v] : src) {
      std::string key = path + "." + std::string{k.str()};
      auto vline = static_cast<int64_t>(v.source().begin.line);
      auto* old = dtbl->get(k.str());
      if (!is_default) {
        if (!old) {
          fail(source, key, vline, "unknown key");
          return false;
        }
        bool ok = old->type() == v.type()
                  || (old->is_floating_point() && v.is_integer());
        if (!ok) {
          fail(source, key, vline,
               std::string{"expected "} + type_name(*old) + ", got " + type_name(v));
          return false;
        }
      }
      if (auto* sub = v.as_table()) {
        if (!merge_table(*dtbl, std::string{k.str()}, *sub, key, source, is_default))
          return false;
        continue;
      }
      if (v.is_integer() && old && old->is_floating_point())
        dtbl->insert_or_assign(k.str(), static_cast<double>(v.as_integer()->get()));
      else
        dtbl->insert_or_assign(k.str(), v);
      origins_[key] = origin{source, vline};
    }
    return true;
  }
};

// Typed reading with semantic checks; each failure names the key.
class reader {
public:
  reader(const toml::table& t, loader& l) : t_(t), l_(l) {}

  std::string str(const char* key) {
    auto v = node(key);
    return v ? v->value_or(std::string{}) : std::string{};
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi) {
    auto v = node(key);
    int64_t x = v ? v->value_or(int64_t{0}) : 0;
    if (x < lo || x > hi)
      l_.fail_at(key, "expected an integer in " + std::to_string(lo) + ".."
                        + std::to_string(hi) + ", got " + std::to_string(x));
    return x;
  }
  double real(const char* key, double lo, double hi) {
    auto v = node(key);
    double x = v ? v->value_or(0.0) : 0.0;
    if (!(x >= lo && x <= hi)) {
      std::ostringstream os;
      os << "expected a number in " << lo << ".." << hi << ", got " << x;
      l_.fail_at(key, os.str());
    }
    return x;
  }
  bool boolean(const char* key) {
    auto v = node(key);
    return v ? v->value_or(false) : false;
  }
  /// A string with a fixed set of values, parsed here once into its enum;
  /// anything else fails naming the allowed values (the first one is
  /// returned then, never used: loading stops at the first error).
  template <class E>
  E one_of(const char* key, std::initializer_list<std::pair<const char*, E>> allowed) {
    auto s = str(key);
    std::string list;
    for (auto& a : allowed) {
      if (s == a.first)
        return a.second;
      list += list.empty() ? "" : ", ";
      list += std::string{"\""} + a.first + "\"";
    }
    l_.fail_at(key, "expected one of " + list + ", got \"" + s + "\"");
    return allowed.begin()->second;
  }
  uint64_t size(const char* key, uint64_t min) {
    auto s = str(key);
    auto v = parse_size(s);
    if (!v)
      l_.fail_at(key, "expected a size like \"512MiB\" or \"4GiB\", got \"" + s + "\"");
    else if (*v < min)
      l_.fail_at(key, "expected at least " + std::to_string(min) + " bytes, got \"" + s + "\"");
    return v.value_or(0);
  }
  duration dur(const char* key, bool zero_ok) {
    auto s = str(key);
    auto v = parse_duration(s);
    if (!v)
      l_.fail_at(key, "expected a duration like \"250ms\" or \"10s\", got \"" + s + "\"");
    else if (!zero_ok && v->count() == 0)
      l_.fail_at(key, "expected a duration above 0, got \"" + s + "\"");
    return v.value_or(duration{});
  }
  /// An array of strings (each checked by `check`, whose error says why not).
  std::vector<std::string> strings(const char* key, status (*check)(const std::string&)) {
    std::vector<std::string> out;
    auto* v = node(key);
    auto* arr = v ? v->as_array() : nullptr;
    if (!arr) {
      l_.fail_at(key, "expected an array of strings");
      return out;
    }
    for (size_t i = 0; i < arr->size(); ++i) {
      auto* s = arr->get(i)->as_string();
      if (!s) {
        l_.fail_at(key, "expected an array of strings, element " + std::to_string(i)
                          + " is not a string");
        return out;
      }
      if (auto ok = check(s->get()); !ok) {
        l_.fail_at(key, "element " + std::to_string(i) + " (\"" + s->get() + "\"): "
                          + ok.error_value().detail);
        return out;
      }
      out.push_back(s->get());
    }
    return out;
  }
  /// Endpoint check: scheme, and a port in range for tcp (0 = ephemeral).
  std::string endpoint(const char* key, bool empty_ok) {
    auto s = str(key);
    if (s.empty()) {
      if (!empty_ok)
        l_.fail_at(key, "expected an endpoint like \"tcp://*:5600\", got \"\"");
      return s;
    }
    if (s.rfind("tcp://", 0) == 0) {
      auto port = tcp_port(s);
      if (port < 0 || port > 65535)
        l_.fail_at(key, "expected tcp://host:port with a port in 0..65535, got \"" + s + "\"");
    } else if (!((s.rfind("ipc://", 0) == 0 && s.size() > 6)
                 || (s.rfind("inproc://", 0) == 0 && s.size() > 9))) {
      l_.fail_at(key, "expected a tcp://, ipc:// or inproc:// endpoint, got \"" + s + "\"");
    }
    return s;
  }

  /// A list of strings (an empty list is fine).
  std::vector<std::string> strings(const char* key) {
    std::vector<std::string> out;
    auto* arr = node(key) ? node(key)->as_array() : nullptr;
    if (!arr)
      return out;
    for (auto& el : *arr) {
      if (!el.is_string()) {
        l_.fail_at(key, "expected a list of strings");
        return {};
      }
      out.push_back(el.value_or(std::string{}));
    }
    return out;
  }

private:
  const toml::node* node(const char* key) {
    return t_.at_path(key).node();
  }
  const toml::table& t_;
  loader& l_;
};

// A cache.shm_allow_prefixes entry: a name start that shm names can have.
status check_shm_prefix(const std::string& p) {
  auto bare = std::string_view{p};
  if (!bare.empty() && bare.front() == '/')
    bare.remove_prefix(1);
  for (unsigned char c : bare)
    if (c < 0x20 || c == 0x7f || c == '/')
      return make_error("bad_value", "a prefix holds no '/' after the leading one and no control character");
  if (bare.size() > 255)
    return make_error("bad_value", "longer than a shared-memory name can be (255)");
  return {};
}

// Every load error but an unreadable file is kind "config"; the detail is
// the one line main() prints.
error to_error(const config_error& e) { return make_error("config", e.to_string()); }

expected<config> finish(const toml::table& t, loader& l) {
  config c;
  reader r{t, l};
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
  c.sidecar.shutdown_timeout = r.dur("sidecar.shutdown_timeout", false);
  c.sidecar.worker_threads = r.integer("sidecar.worker_threads", 0, 64);
  c.sidecar.io_nice = r.integer("sidecar.io_nice", -20, 0);

  auto& e = c.events;
  e.enabled = r.boolean("events.enabled");
  e.format = r.one_of<event_dialect>(
    "events.format", {{"vllm", event_dialect::vllm}, {"tokenspeed", event_dialect::tokenspeed}});
  e.seq_start_clock = r.one_of<bool>("events.seq_start", {{"zero", false}, {"clock", true}});
  e.keepalive_interval = r.dur("events.keepalive_interval", true);
  e.published_dp_rank_zero =
    r.one_of<bool>("events.published_dp_rank", {{"engine", false}, {"zero", true}});
  e.dp_size = r.integer("events.dp_size", 1, 1024);
  e.ingest_endpoint = r.endpoint("events.ingest_endpoint", false);
  e.ingest_replay_endpoint = r.endpoint("events.ingest_replay_endpoint", true);
  e.ingest_gap_timeout = r.dur("events.ingest_gap_timeout", false);
  e.endpoint = r.endpoint("events.endpoint", false);
  e.replay_endpoint = r.endpoint("events.replay_endpoint", true);
  e.buffer_steps = r.integer("events.buffer_steps", 0, 100000000);
  e.buffer_bytes = r.size("events.buffer_bytes", 0);
  e.replay_rate = r.integer("events.replay_rate", 0, 1000000000);
  e.replay_nice = r.integer("events.replay_nice", 0, 19);
  e.index_max_blocks = r.integer("events.index_max_blocks", 1, 1000000000);
  e.hwm = r.integer("events.hwm", 1, 1000000000);
  e.ingest_hwm = r.integer("events.ingest_hwm", 1, 1000000000);
  e.ingest_max_message_size = r.size("events.ingest_max_message_size", 1024);
  if (!l.error && e.ingest_max_message_size > (uint64_t{1} << 40))
    l.fail_at("events.ingest_max_message_size", "expected at most 1TiB");
  e.replay_hwm = r.integer("events.replay_hwm", 1, 1000000000);
  e.max_queue_size = r.integer("events.max_queue_size", 1, 1000000000);
  e.max_queue_bytes = r.size("events.max_queue_bytes", 1024 * 1024);
  if (!l.error && e.max_queue_bytes > (uint64_t{1} << 50))
    l.fail_at("events.max_queue_bytes", "expected at most 1PiB");
  e.topic = r.str("events.topic");
  // Every rank's endpoints must be derivable (vLLM's offset rule).
  for (auto key : {"events.ingest_endpoint", "events.ingest_replay_endpoint",
                   "events.endpoint", "events.replay_endpoint"}) {
    auto ep = r.str(key);
    if (l.error || ep.empty())
      continue;
    if (auto last = offset_endpoint(ep, e.dp_size - 1); !last)
      l.fail_at(key, "cannot derive the endpoint of dp rank " + std::to_string(e.dp_size - 1)
                       + ": " + last.error_value().detail);
  }

  auto& k = c.cache;
  k.enabled = r.boolean("cache.enabled");
  k.endpoint = r.endpoint("cache.endpoint", false);
  k.chunk_size = r.integer("cache.chunk_size", 1, 1 << 20);
  k.l1_size = r.size("cache.l1_size", 1 << 20);
  k.l1_prefault = r.one_of<l1_prefault_mode>(
    "cache.l1_prefault", {{"off", l1_prefault_mode::off},
                          {"start", l1_prefault_mode::start},
                          {"background", l1_prefault_mode::background}});
  k.evict_high = r.real("cache.evict_high", 0.01, 1.0);
  k.evict_low = r.real("cache.evict_low", 0.0, 1.0);
  if (!l.error && k.evict_low >= k.evict_high)
    l.fail_at("cache.evict_low", "expected evict_low below evict_high");
  k.session_ttl = r.dur("cache.session_ttl", false);
  k.max_sessions = r.integer("cache.max_sessions", 1, 100000000);
  k.lock_ttl = r.dur("cache.lock_ttl", false);
  k.heartbeat_timeout = r.dur("cache.heartbeat_timeout", true);
  k.registration_grace = r.dur("cache.registration_grace", true);
  if (!l.error && k.registration_grace < k.heartbeat_timeout)
    l.fail_at("cache.registration_grace",
              "expected at least cache.heartbeat_timeout (" + to_string(k.heartbeat_timeout)
                + "), got " + to_string(k.registration_grace));
  k.kv_event_log_size = r.integer("cache.kv_event_log_size", 0, 100000000);
  k.events_rank = r.integer("cache.events_rank", -1, 1023);
  k.hwm = r.integer("cache.hwm", 1, 1000000000);
  k.engine_driven_slots = r.integer("cache.engine_driven_slots", 1, 65536);
  if (!l.error && k.events_rank >= e.dp_size)
    l.fail_at("cache.events_rank", "expected -1 or a dp rank below events.dp_size ("
                                     + std::to_string(e.dp_size) + "), got "
                                     + std::to_string(k.events_rank));

  k.shm_allow_prefixes = r.strings("cache.shm_allow_prefixes", check_shm_prefix);
  k.grpc_endpoint = r.str("cache.grpc_endpoint");
  if (auto ok = check_grpc_endpoint(k.grpc_endpoint); !ok && !l.error)
    l.fail_at("cache.grpc_endpoint", ok.error_value().detail);
  k.grpc_tls_cert_file = r.str("cache.grpc_tls_cert_file");
  k.grpc_tls_key_file = r.str("cache.grpc_tls_key_file");
  k.grpc_tls_client_ca_file = r.str("cache.grpc_tls_client_ca_file");
  if (!l.error && k.grpc_tls_cert_file.empty() != k.grpc_tls_key_file.empty())
    l.fail_at(k.grpc_tls_cert_file.empty() ? "cache.grpc_tls_key_file" : "cache.grpc_tls_cert_file",
              "TLS needs both cache.grpc_tls_cert_file and cache.grpc_tls_key_file (set both, or "
              "neither)");
  if (!l.error && !k.grpc_tls_client_ca_file.empty() && k.grpc_tls_cert_file.empty())
    l.fail_at("cache.grpc_tls_client_ca_file",
              "client certificates need TLS: set cache.grpc_tls_cert_file and cache.grpc_tls_key_file");
  if (!l.error && !k.grpc_tls_cert_file.empty() && k.grpc_endpoint.rfind("grpc://", 0) != 0)
    l.fail_at("cache.grpc_tls_cert_file", "TLS is for a grpc://host:port cache.grpc_endpoint");
  for (auto [key, file, pem] : {std::tuple{"cache.grpc_tls_cert_file", &k.grpc_tls_cert_file, &k.grpc_tls_cert_pem},
                                std::tuple{"cache.grpc_tls_key_file", &k.grpc_tls_key_file, &k.grpc_tls_key_pem},
                                std::tuple{"cache.grpc_tls_client_ca_file", &k.grpc_tls_client_ca_file,
                                           &k.grpc_tls_client_ca_pem}}) {
    if (l.error || file->empty())
      continue;
    auto text = read_text_file(*file);
    if (!text)
      l.fail_at(key, text.error_value().detail);
    else
      *pem = std::move(*text);
  }

  c.gpu.backend = r.one_of<gpu_backend>(
    "gpu.backend",
    {{"auto", gpu_backend::automatic}, {"cuda", gpu_backend::cuda}, {"host", gpu_backend::host}});

  auto& sec = c.security;
  sec.curve_secret_key_file = r.str("security.curve_secret_key_file");
  sec.curve_allowed_clients_dir = r.str("security.curve_allowed_clients_dir");
  if (!l.error && sec.curve_secret_key_file.empty() != sec.curve_allowed_clients_dir.empty()) {
    // Named at the key that was set, where the operator looks.
    bool secret_set = !sec.curve_secret_key_file.empty();
    l.fail_at(secret_set ? "security.curve_secret_key_file" : "security.curve_allowed_clients_dir",
              std::string{"CURVE also needs "}
                + (secret_set ? "security.curve_allowed_clients_dir" : "security.curve_secret_key_file")
                + " (set both, or neither)");
  }
  if (!l.error && sec.curve_enabled()) {
    auto key = read_curve_key(sec.curve_secret_key_file, true);
    if (!key)
      l.fail_at("security.curve_secret_key_file", key.error_value().detail);
    else
      sec.curve_secret_key = *key;
    if (!l.error) {
      auto keys = read_curve_public_keys(sec.curve_allowed_clients_dir);
      if (!keys)
        l.fail_at("security.curve_allowed_clients_dir", keys.error_value().detail);
      else
        sec.curve_allowed_keys = std::move(*keys);
    }
  }
  c.http.enabled = r.boolean("http.enabled");
  c.http.listen = r.str("http.listen");
  if (auto ok = check_listen_address(c.http.listen); !ok && !l.error)
    l.fail_at("http.listen", ok.error_value().detail);

  auto& l2 = c.l2;
  l2.queue_bytes = r.size("l2.queue_bytes", 1 << 20);
  l2.disk.enabled = r.boolean("l2.disk.enabled");
  l2.disk.path = r.str("l2.disk.path");
  l2.disk.size = r.size("l2.disk.size", 1 << 20);
  if (!l.error && l2.disk.enabled && l2.disk.path.empty())
    l.fail_at("l2.disk.path", "expected a directory when l2.disk.enabled is true");
  auto& rd = l2.redis;
  rd.enabled = r.boolean("l2.redis.enabled");
  rd.endpoints = r.strings("l2.redis.endpoints");
  rd.cluster = r.boolean("l2.redis.cluster");
  rd.password = r.str("l2.redis.password");
  rd.key_prefix = r.str("l2.redis.key_prefix");
  rd.ttl = r.dur("l2.redis.ttl", true);
  rd.connections = r.integer("l2.redis.connections", 1, 64);
  rd.timeout = r.dur("l2.redis.timeout", false);
  if (!l.error && rd.enabled && rd.endpoints.empty())
    l.fail_at("l2.redis.endpoints", "expected at least one \"host:port\" when l2.redis.enabled is true");
  for (auto& ep : rd.endpoints) {
    auto colon = ep.rfind(':');
    long port = -1;
    if (colon != std::string::npos && colon > 0 && colon + 1 < ep.size()) {
      char* end = nullptr;
      port = std::strtol(ep.c_str() + colon + 1, &end, 10);
      if (*end != '\0')
        port = -1;
    }
    if (!l.error && (port < 1 || port > 65535))
      l.fail_at("l2.redis.endpoints", "expected \"host:port\" with a port in 1..65535, got \"" + ep + "\"");
  }

  if (l.error)
    return to_error(*l.error);
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
