// The log layer escapes control characters: a client-supplied string (shm
// name, request id) can never start a line of its own.
#include "log/log.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace {

/// Everything the logger writes to stderr while `fn` runs.
template <class Fn>
std::string capture_stderr(Fn fn) {
  const char* path = "/tmp/kvs_test_log_escape.txt";
  int fd = ::open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(fd, 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in{path};
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path);
  return ss.str();
}

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s)
    n += c == '\n';
  return n;
}

const std::string forged = "/kvs_x\n2026-11-30T12:00:00.000000Z INFO  registry#3 forged\r\x1b[2J\\n";

} // namespace

TEST_CASE("text format: one line, control characters and backslashes escaped") {
  kvs::log::init(kvs::log::format::text, kvs::log::level::info, "test");
  auto out = capture_stderr([] {
    KVS_WARN("engine_bridge#1", "register of '{}' failed", forged);
  });
  CHECK(count_lines(out) == 1);
  CHECK(out.find("register of '/kvs_x\\n2026-11-30T12:00:00.000000Z INFO  registry#3 forged"
                 "\\r\\x1b[2J\\\\n' failed\n")
        != std::string::npos);
  CHECK(out.find('\x1b') == std::string::npos);
  CHECK(out.find('\r') == std::string::npos);
}

TEST_CASE("text format: the actor label is escaped too") {
  kvs::log::init(kvs::log::format::text, kvs::log::level::info, "test");
  auto out = capture_stderr([] { KVS_INFO("session[rid=a\nb]#4", "ended"); });
  CHECK(count_lines(out) == 1);
  CHECK(out.find("session[rid=a\\nb]#4 ended") != std::string::npos);
}

TEST_CASE("json format: one object per line, JSON escapes") {
  kvs::log::init(kvs::log::format::json, kvs::log::level::info, "test");
  auto out = capture_stderr([] {
    KVS_WARN("engine_bridge#1", "register of '{}' failed", forged);
  });
  kvs::log::init(kvs::log::format::text, kvs::log::level::info, "test");
  CHECK(count_lines(out) == 1);
  CHECK(out.find("\"msg\":\"register of '/kvs_x\\n2026-11-30T12:00:00.000000Z INFO  registry#3 "
                 "forged\\r\\u001b[2J\\\\n' failed\"}")
        != std::string::npos);
}
