// What every section's reader shares (private to config/): the loader
// (TOML parsing, --set overrides, where each value came from) and the typed
// reader whose every failure names its key. One file per section reads and
// checks that section's keys: config/section_<name>.cpp.
#pragma once

#include "config/config.hpp"

#include <toml++/toml.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::config_detail {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

// Parses the port of a tcp endpoint; -1 when there is none or it is not a number.
inline long tcp_port(const std::string& ep) {
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
      // [cache.quotas] is keyed by cache_salt: its keys are the user's
      // (section_quotas.cpp checks them and their values).
      if (!is_default && !old && path == "cache.quotas") {
        dtbl->insert_or_assign(k.str(), v);
        origins_[key] = origin{source, vline};
        continue;
      }
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

  /// A table (nullptr when absent or not a table).
  const toml::table* table(const char* key) {
    auto* n = node(key);
    return n ? n->as_table() : nullptr;
  }

private:
  const toml::node* node(const char* key) {
    return t_.at_path(key).node();
  }
  const toml::table& t_;
  loader& l_;
};

// Each reads its section's keys into `c` (later sections may read earlier
// ones: cache.events_rank is checked against events.dp_size).
void read_sidecar_section(reader& r, loader& l, config& c); // [sidecar], [gpu], [http]
void read_events_section(reader& r, loader& l, config& c);  // [events]
void read_cache_section(reader& r, loader& l, config& c);   // [cache]
void read_security_section(reader& r, loader& l, config& c); // [security]
void read_l2_section(reader& r, loader& l, config& c);      // [l2], [l2.disk], [l2.redis]
void read_control_section(reader& r, loader& l, config& c); // cache.quota_mode, [cache.quotas], http.admin_token
void read_coordinator_section(reader& r, loader& l, config& c); // [coordinator]

} // namespace kvs::config_detail
