#include "log/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>

namespace kvs::log {

namespace {

std::atomic<int> min_level_{static_cast<int>(level::info)};
std::atomic<bool> json_{false};
std::shared_ptr<spdlog::logger> logger_;

spdlog::level::level_enum to_spd(level l) {
  switch (l) {
    case level::trace: return spdlog::level::trace;
    case level::debug: return spdlog::level::debug;
    case level::info: return spdlog::level::info;
    case level::warn: return spdlog::level::warn;
    case level::error: return spdlog::level::err;
    default: return spdlog::level::off;
  }
}

// Escapes control characters and the backslash, so a client-supplied string
// (shm name, request id, model name) cannot write a line, or an escape, that
// looks like the sidecar's own. JSON lines also escape '"' and use \uXXXX;
// text lines use \xNN.
enum class escape_style { json, text };

void escape(std::string& out, std::string_view s, escape_style style) {
  const bool json = style == escape_style::json;
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == '"' && json)
          out += "\\\"";
        else if (c < 0x20 || c == 0x7f)
          out += json ? fmt::format("\\u{:04x}", c) : fmt::format("\\x{:02x}", c);
        else
          out += static_cast<char>(c);
    }
  }
}

std::shared_ptr<spdlog::logger> make_logger(bool json) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto lg = std::make_shared<spdlog::logger>("kvsidecar", sink);
  // spdlog's %l gives "info"/"warning"/"error"; we want short upper-case
  // names in text and the same lower-case names in JSON.
  if (json)
    lg->set_pattern("{\"ts\":\"%Y-%m-%dT%H:%M:%S.%fZ\",%v}", spdlog::pattern_time_type::utc);
  else
    lg->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %v", spdlog::pattern_time_type::utc);
  lg->set_level(spdlog::level::trace);
  lg->flush_on(spdlog::level::trace);
  return lg;
}

const char* level_name(level l, bool json) {
  static const char* text[] = {"TRACE", "DEBUG", "INFO ", "WARN ", "ERROR"};
  static const char* js[] = {"trace", "debug", "info", "warn", "error"};
  auto i = static_cast<int>(l);
  return i >= 0 && i < 5 ? (json ? js[i] : text[i]) : "?";
}

} // namespace

void init(format fmt, level min_level, std::string_view) {
  json_ = fmt == format::json;
  min_level_ = static_cast<int>(min_level);
  auto lg = make_logger(json_);
  std::atomic_store(&logger_, lg);
}

bool enabled(level lvl) {
  return static_cast<int>(lvl) >= min_level_.load(std::memory_order_relaxed);
}

void write(level lvl, std::string_view actor, std::string_view msg) {
  auto lg = std::atomic_load(&logger_);
  if (!lg) {
    lg = make_logger(false);
    std::shared_ptr<spdlog::logger> expected;
    std::atomic_compare_exchange_strong(&logger_, &expected, lg);
    lg = std::atomic_load(&logger_);
  }
  std::string line;
  line.reserve(actor.size() + msg.size() + 48);
  if (json_) {
    line += "\"level\":\"";
    line += level_name(lvl, true);
    line += "\",\"actor\":\"";
    escape(line, actor, escape_style::json);
    line += "\",\"msg\":\"";
    escape(line, msg, escape_style::json);
    line += "\"";
  } else {
    line += level_name(lvl, false);
    line += ' ';
    escape(line, actor, escape_style::text);
    line += ' ';
    escape(line, msg, escape_style::text);
  }
  lg->log(to_spd(lvl), "{}", line);
}

std::string label(std::string_view name, std::string_view detail, uint64_t id) {
  std::string s{name};
  if (!detail.empty()) {
    s += '[';
    s += detail;
    s += ']';
  }
  s += '#';
  s += std::to_string(id);
  return s;
}

} // namespace kvs::log
