// kvsidecar: command line, config loading and the process exit status.
#include "log/log.hpp"
#include "log/stats_repeat.hpp"
#include "app/sidecar.hpp"
#include "config/config.hpp"
#include "core/version.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{
    "kvsidecar — KV-cache sidecar for LLM inference engines.\n"
    "Relays each DP rank's KV-cache events to KV-aware routers (vLLM wire format, with\n"
    "replay) and serves LMCache's multi-process protocol as a KV cache server.\n"
    "With no arguments it runs on the built-in default configuration\n"
    "(see --print-default-config)."};
  std::string config_file;
  std::vector<std::string> overrides;
  std::string check_file;
  bool print_default = false;
  bool version = false;
  app.add_option("-c,--config", config_file, "TOML config file, applied over the built-in default")
    ->check(CLI::ExistingFile);
  app.add_option("-s,--set", overrides,
                 "Override one key: --set section.key=value (repeatable; applied after --config)")
    ->take_all();
  app.add_flag("--print-default-config", print_default,
               "Print the built-in default config (documented TOML) and exit");
  app.add_option("--check-config", check_file,
                 "Validate FILE (with any --set) and exit: 0 when valid, 2 with the error otherwise");
  app.add_flag("-V,--version", version, "Print the version and exit");
  app.footer(
    "Exit status: 0 clean shutdown (SIGTERM/SIGINT; a second SIGINT exits at once, 130),\n"
    "1 start-up failure (e.g. a port in use), 2 invalid configuration or arguments,\n"
    "3 a long-lived actor exited unexpectedly (restart the container).\n"
    "Logs go to stderr, one line per event: UTC time, level, actor[detail]#id, message.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    auto rc = app.exit(e);
    return rc == 0 ? 0 : kvs::exit_bad_config;
  }
  if (version) {
    std::cout << "kvsidecar " << kvs::version << "\n";
    return 0;
  }
  if (print_default) {
    std::cout << kvs::default_config_toml;
    return 0;
  }
  if (!check_file.empty()) {
    auto res = kvs::load_config(check_file, overrides);
    if (!res) {
      std::cerr << res.error_value().detail << "\n";
      return kvs::exit_bad_config;
    }
    std::cout << check_file << ": valid\n";
    return 0;
  }
  auto res = kvs::load_config(config_file, overrides);
  if (!res) {
    std::cerr << res.error_value().detail << "\n";
    return kvs::exit_bad_config;
  }
  kvs::block_signals();
  kvs::log::init(res->sidecar.log_format, res->sidecar.log_level, res->sidecar.name);
  kvs::log::set_stats_repeat(res->sidecar.stats_repeat);
  return kvs::run_sidecar(*res);
}
