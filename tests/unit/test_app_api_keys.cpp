// load_api_keys: LMCache 0.5.7's sources and order (files, then the
// environment's file, then its value; the new variable names before the
// legacy LMCACHE_HTTP_* ones), and its refusals of a bad key file.
#include <doctest/doctest.h>

#include "app/api_keys.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

using namespace kvs;

namespace {

struct temp_dir {
  std::filesystem::path path =
    std::filesystem::temp_directory_path() / ("kvs_api_keys_" + std::to_string(getpid()));
  temp_dir() { std::filesystem::create_directories(path); }
  ~temp_dir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    auto p = path / name;
    std::ofstream{p, std::ios::binary} << text;
    return p.string();
  }
};

env_lookup env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

} // namespace

TEST_CASE("api keys: files, then the environment's file, then its value") {
  temp_dir d;
  auto a = d.file("a", "key-from-a\n");
  auto b = d.file("b", "  key-from-b  \r\n");
  auto e = d.file("e", "key-from-env-file");
  auto keys = load_api_keys({a, b}, env_of({{"LMCACHE_HTTP_API_KEY_FILE", e},
                                            {"LMCACHE_HTTP_API_KEY", "key-from-env"}}));
  REQUIRE_MESSAGE(keys.has_value(), keys.error_value().detail);
  CHECK(keys.value() == std::vector<std::string>{"key-from-a", "key-from-b", "key-from-env-file",
                                                 "key-from-env"});
  // LMCACHE_API_KEY(_FILE) win over the legacy names; empty means unset.
  auto n = d.file("n", "new-file-key");
  keys = load_api_keys({}, env_of({{"LMCACHE_API_KEY_FILE", n},
                                   {"LMCACHE_HTTP_API_KEY_FILE", e},
                                   {"LMCACHE_API_KEY", ""},
                                   {"LMCACHE_HTTP_API_KEY", "legacy-value"}}));
  REQUIRE(keys.has_value());
  CHECK(keys.value() == std::vector<std::string>{"new-file-key", "legacy-value"});
  keys = load_api_keys({}, env_of({}));
  REQUIRE(keys.has_value());
  CHECK(keys.value().empty());
}

TEST_CASE("api keys: an empty, multi-line or missing file is refused with its path") {
  temp_dir d;
  auto empty = d.file("empty", " \n\n");
  auto two = d.file("two", "one\ntwo\n");
  auto missing = (d.path / "missing").string();
  for (auto& [path, words] : std::vector<std::pair<std::string, std::string>>{
         {empty, "API key file is empty: " + empty},
         {two, "API key file must contain exactly one line: " + two},
         {missing, "\"" + missing + "\" cannot be read"}}) {
    auto keys = load_api_keys({path}, env_of({}));
    REQUIRE_FALSE(keys.has_value());
    CHECK_MESSAGE(keys.error_value().detail.find(words) != std::string::npos,
                  keys.error_value().detail);
  }
  auto via_env = load_api_keys({}, env_of({{"LMCACHE_HTTP_API_KEY_FILE", two}}));
  CHECK_FALSE(via_env.has_value());
}
