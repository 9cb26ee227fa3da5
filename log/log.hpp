// Logging: one line per event, naming the actor that wrote it.
//
// Text:  2026-11-30T12:00:00.123456Z INFO  publisher[dp=0]#12 started ...
// JSON:  {"ts":"2026-11-30T12:00:00.123456Z","level":"info","actor":"publisher[dp=0]#12","msg":"started ..."}
// A thin layer over spdlog (UTC, synchronous, flushed per line so operators
// and tests see lines as they happen).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace kvs::log {

enum class level { trace = 0, debug, info, warn, error, off };

/// Line format (sidecar.log_format).
enum class format { text, json };

/// Configures the process-wide logger.
void init(format fmt, level min_level, std::string_view process);

/// True when lines at `lvl` are written (checked before formatting).
bool enabled(level lvl);

/// Writes one line. `actor` is the label, e.g. "publisher[dp=0]#12".
void write(level lvl, std::string_view actor, std::string_view msg);

/// "name[detail]#id", the label of an actor in every line it writes.
std::string label(std::string_view name, std::string_view detail, uint64_t id);

} // namespace kvs::log

#define KVS_LOG(lvl, actor, ...)                                                       \
  do {                                                                                 \
    if (::kvs::log::enabled(lvl))                                                      \
      ::kvs::log::write(lvl, actor, ::fmt::format(__VA_ARGS__));                       \
  } while (false)

#define KVS_TRACE(actor, ...) KVS_LOG(::kvs::log::level::trace, actor, __VA_ARGS__)
#define KVS_DEBUG(actor, ...) KVS_LOG(::kvs::log::level::debug, actor, __VA_ARGS__)
#define KVS_INFO(actor, ...) KVS_LOG(::kvs::log::level::info, actor, __VA_ARGS__)
#define KVS_WARN(actor, ...) KVS_LOG(::kvs::log::level::warn, actor, __VA_ARGS__)
#define KVS_ERROR(actor, ...) KVS_LOG(::kvs::log::level::error, actor, __VA_ARGS__)
