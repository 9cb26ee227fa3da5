// Config loading: defaults, overrides, and one clear error per bad input.
#include "config/config.hpp"
#include "config/curve_keys.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>

using namespace kvs;

namespace {

// A load error's detail taken apart again: "config error: <source>[:<line>]
// [: key '<key>']: <what>", so each part can be checked on its own.
struct config_error {
  std::string source, key;
  int64_t line = 0;
  std::string what;
};

config_error parse_detail(const std::string& detail) {
  static const std::regex shape{R"(config error: ([^:]*)(?::(\d+))?(?:: key '([^']*)')?: (.*))"};
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_match(detail, m, shape), "not a config error line: " << detail);
  return {m[1], m[3], m[2].matched ? std::stoll(m[2]) : 0, m[4]};
}

config_error error_of(const std::string& toml, std::vector<std::string> sets = {}) {
  auto r = load_config_text(toml, "test.toml", sets);
  REQUIRE_MESSAGE(!r.has_value(), "expected an error for: " << toml);
  CHECK(r.error_value().kind == "config");
  return parse_detail(r.error_value().detail);
}

config ok(const std::string& toml, std::vector<std::string> sets = {}) {
  auto r = load_config_text(toml, "test.toml", sets);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error_value().detail));
  return *r;
}

} // namespace

TEST_CASE("the compiled-in default is valid and has the documented values") {
  auto c = ok("");
  CHECK(c.sidecar.log_format == log::format::text);
  CHECK(c.sidecar.stats_interval == std::chrono::seconds{10});
  CHECK(c.events.enabled);
  CHECK(c.events.format == event_dialect::vllm);
  CHECK(c.events.dp_size == 1);
  CHECK(c.events.ingest_endpoint == "tcp://127.0.0.1:5557");
  CHECK(c.events.endpoint == "tcp://*:5600");
  CHECK(c.events.replay_endpoint == "tcp://*:5700");
  CHECK(c.events.buffer_steps == 10000);
  CHECK(c.events.buffer_bytes == (uint64_t{512} << 20));
  CHECK(c.events.replay_rate == 50000);
  CHECK(c.events.replay_nice == 10);
  CHECK(c.events.index_max_blocks == 1000000);
  CHECK(c.events.hwm == 10000);
  CHECK(c.events.ingest_hwm == 10000);
  CHECK(c.events.ingest_max_message_size == (uint64_t{64} << 20));
  CHECK(c.events.replay_hwm == 1000);
  CHECK(c.cache.hwm == 100000);
  CHECK(c.events.max_queue_size == 100000);
  CHECK(c.events.max_queue_bytes == (uint64_t{1} << 30));
  CHECK(c.events.topic.empty());
  CHECK(c.cache.endpoint == "tcp://127.0.0.1:5555");
  CHECK(c.cache.chunk_size == 256);
  CHECK(c.cache.l1_size == (uint64_t{4} << 30));
  CHECK(c.cache.l1_prefault == l1_prefault_mode::background);
  CHECK(c.cache.l1_prefault_ahead == (uint64_t{1} << 30));
  CHECK(c.cache.evict_high == doctest::Approx(0.9));
  CHECK(c.cache.evict_low == doctest::Approx(0.8));
  CHECK(c.cache.session_ttl == std::chrono::seconds{600});
  CHECK(c.cache.max_sessions == 65536);
  CHECK(c.cache.lock_ttl == std::chrono::seconds{300});
  CHECK(c.cache.heartbeat_timeout == std::chrono::seconds{120});
  CHECK(c.cache.registration_grace == std::chrono::seconds{3600});
  CHECK(c.cache.kv_event_log_size == 32768);
  CHECK(c.cache.events_rank == 0);
  CHECK(c.gpu.backend == gpu_backend::automatic);
  CHECK(c.cache.shm_allow_prefixes == std::vector<std::string>{"/lmcache_kv_", "/kvs_"});
  CHECK_FALSE(c.security.curve_enabled());
}

TEST_CASE("a file overrides only the keys it names; --set comes last") {
  auto c = ok("[events]\nformat = \"tokenspeed\"\ndp_size = 2\n", {"events.dp_size=4", "cache.l1_size=\"512MiB\""});
  CHECK(c.events.format == event_dialect::tokenspeed);
  CHECK(c.events.dp_size == 4);
  CHECK(c.cache.l1_size == (uint64_t{512} << 20));
  CHECK(c.cache.chunk_size == 256);
}

TEST_CASE("--set takes bare strings and typed values") {
  auto c = ok("", {"events.endpoint=tcp://*:7000", "cache.evict_high=1", "events.enabled=false",
                   "sidecar.stats_interval=0s"});
  CHECK(c.events.endpoint == "tcp://*:7000");
  CHECK(c.cache.evict_high == doctest::Approx(1.0));
  CHECK_FALSE(c.events.enabled);
  CHECK(c.sidecar.stats_interval.count() == 0);
}

TEST_CASE("unknown key: names file, key and line") {
  auto e = error_of("[events]\n\nfromat = \"vllm\"\n");
  CHECK(e.source == "test.toml");
  CHECK(e.key == "events.fromat");
  CHECK(e.line == 3);
  CHECK(e.what == "unknown key");
  CHECK(load_config_text("[events]\n\nfromat = \"vllm\"\n", "test.toml").error_value().detail ==
        "config error: test.toml:3: key 'events.fromat': unknown key");
}

TEST_CASE("unknown section") {
  auto e = error_of("[evnts]\nformat = \"vllm\"\n");
  CHECK(e.key == "evnts");
  CHECK(e.line == 1);
}

TEST_CASE("wrong type") {
  auto e = error_of("[events]\ndp_size = \"two\"\n");
  CHECK(e.key == "events.dp_size");
  CHECK(e.line == 2);
  CHECK(e.what == "expected an integer, got a string");
}

TEST_CASE("port out of range") {
  auto e = error_of("[events]\nendpoint = \"tcp://*:70000\"\n");
  CHECK(e.key == "events.endpoint");
  CHECK(e.line == 2);
  CHECK(e.what.find("0..65535") != std::string::npos);
}

TEST_CASE("impossible sizes and durations") {
  auto e = error_of("[cache]\nl1_size = \"4XB\"\n");
  CHECK(e.key == "cache.l1_size");
  CHECK(e.line == 2);
  CHECK(e.what.find("\"4XB\"") != std::string::npos);
  e = error_of("[cache]\nlock_ttl = \"10 parsecs\"\n");
  CHECK(e.key == "cache.lock_ttl");
  e = error_of("[cache]\nlock_ttl = \"0s\"\n");
  CHECK(e.what.find("above 0") != std::string::npos);
}

TEST_CASE("enums, ranges and cross-key rules") {
  CHECK(error_of("[events]\nformat = \"json\"\n").key == "events.format");
  auto pf = error_of("[cache]\nl1_prefault = \"eager\"\n");
  CHECK(pf.key == "cache.l1_prefault");
  CHECK(pf.what.find("\"off\", \"start\", \"background\", \"ahead\"") != std::string::npos);
  CHECK(ok("[cache]\nl1_prefault = \"background\"\n").cache.l1_prefault
        == l1_prefault_mode::background);
  CHECK(ok("[cache]\nl1_prefault = \"off\"\n").cache.l1_prefault == l1_prefault_mode::off);
  CHECK(ok("[cache]\nl1_prefault = \"ahead\"\n").cache.l1_prefault == l1_prefault_mode::ahead);
  CHECK(ok("[cache]\nl1_prefault_ahead = \"256MiB\"\n").cache.l1_prefault_ahead
        == (uint64_t{256} << 20));
  CHECK(error_of("[cache]\nl1_prefault_ahead = \"1KiB\"\n").key == "cache.l1_prefault_ahead");
  CHECK(error_of("[sidecar]\nlog_format = \"xml\"\n").key == "sidecar.log_format");
  CHECK(error_of("[gpu]\nbackend = \"rocm\"\n").key == "gpu.backend");
  CHECK(ok("").gpu.host_prefault);
  CHECK_FALSE(ok("[gpu]\nhost_prefault = false\n").gpu.host_prefault);
  CHECK_FALSE(ok("", {"gpu.host_prefault=false"}).gpu.host_prefault);
  CHECK(error_of("[gpu]\nhost_prefault = \"on\"\n").key == "gpu.host_prefault");
  CHECK(ok("").gpu.host_copy_threads == 2);
  CHECK_FALSE(ok("").cache.l1_arena_ahead);
  CHECK(ok("[cache]\nl1_arena_ahead = true\n").cache.l1_arena_ahead);
  CHECK(error_of("[cache]\nl1_arena_ahead = 1\n").key == "cache.l1_arena_ahead");
  CHECK(ok("[gpu]\nhost_copy_threads = 1\n").gpu.host_copy_threads == 1);
  CHECK(error_of("[gpu]\nhost_copy_threads = 0\n").key == "gpu.host_copy_threads");
  CHECK(error_of("[gpu]\nhost_copy_threads = 17\n").key == "gpu.host_copy_threads");
  CHECK(error_of("[events]\ndp_size = 0\n").key == "events.dp_size");
  auto idx = error_of("[events]\n\nindex_max_blocks = 0\n");
  CHECK(idx.key == "events.index_max_blocks");
  CHECK(idx.line == 3);
  auto nice = error_of("[events]\nreplay_nice = 20\n");
  CHECK(nice.key == "events.replay_nice");
  CHECK(nice.what == "expected an integer in 0..19, got 20");
  CHECK(ok("[events]\nreplay_nice = 0\n").events.replay_nice == 0);
  CHECK(error_of("[cache]\nevict_low = 0.95\n").key == "cache.evict_low");
  CHECK(error_of("[cache]\nevents_rank = 3\n").key == "cache.events_rank");
  CHECK(error_of("[cache]\nmax_sessions = 0\n").what == "expected an integer in 1..100000000, got 0");
  CHECK(error_of("[cache]\nkv_event_log_size = -1\n").key == "cache.kv_event_log_size");
  CHECK(ok("[cache]\nkv_event_log_size = 0\n").cache.kv_event_log_size == 0);
  CHECK(error_of("[events]\nendpoint = \"udp://x:1\"\n").key == "events.endpoint");
  CHECK(error_of("[events]\ndp_size = 2\nendpoint = \"tcp://*:65535\"\n").what.find("dp rank 1")
        != std::string::npos);
}

TEST_CASE("cache.grpc_endpoint and its TLS keys; events.published_dp_rank and keepalive_interval") {
  CHECK(ok("").cache.grpc_endpoint.empty()); // off by default
  CHECK(ok("[cache]\ngrpc_endpoint = \"grpc://127.0.0.1:5556\"\n").cache.grpc_endpoint ==
        "grpc://127.0.0.1:5556");
  CHECK(ok("[cache]\ngrpc_endpoint = \"grpc+unix:///run/kvs.sock\"\n").cache.grpc_endpoint ==
        "grpc+unix:///run/kvs.sock");
  for (const char* bad : {"tcp://127.0.0.1:5556", "grpc://127.0.0.1", "grpc://:5556",
                          "grpc://h:70000", "grpc+unix://relative.sock", "grpc+unix://"}) {
    auto e = error_of(std::string("[cache]\ngrpc_endpoint = \"") + bad + "\"\n");
    CHECK_MESSAGE(e.key == "cache.grpc_endpoint", bad);
    CHECK_MESSAGE(e.line == 2, bad);
  }
  auto tls = error_of("[cache]\ngrpc_endpoint = \"grpc://127.0.0.1:1\"\ngrpc_tls_cert_file = \"c.pem\"\n");
  CHECK(tls.key == "cache.grpc_tls_cert_file");
  CHECK(tls.what.find("both cache.grpc_tls_cert_file and cache.grpc_tls_key_file") != std::string::npos);
  auto ca = error_of("[cache]\ngrpc_endpoint = \"grpc://127.0.0.1:1\"\ngrpc_tls_client_ca_file = \"ca.pem\"\n");
  CHECK(ca.key == "cache.grpc_tls_client_ca_file");
  auto unix_tls = error_of("[cache]\ngrpc_endpoint = \"grpc+unix:///x.sock\"\n"
                           "grpc_tls_cert_file = \"c\"\ngrpc_tls_key_file = \"k\"\n");
  CHECK(unix_tls.key == "cache.grpc_tls_cert_file");
  // The PEM files are read with the config: a missing one names its key.
  auto missing = error_of("[cache]\ngrpc_endpoint = \"grpc://127.0.0.1:1\"\n"
                          "grpc_tls_cert_file = \"/nonexistent/c.pem\"\n"
                          "grpc_tls_key_file = \"/nonexistent/k.pem\"\n");
  CHECK(missing.key == "cache.grpc_tls_cert_file");
  CHECK(missing.what.find("cannot read \"/nonexistent/c.pem\"") != std::string::npos);
  CHECK_FALSE(ok("").events.published_dp_rank_zero);
  CHECK(ok("[events]\npublished_dp_rank = \"zero\"\n").events.published_dp_rank_zero);
  CHECK(error_of("[events]\npublished_dp_rank = \"one\"\n").key == "events.published_dp_rank");
  CHECK(ok("").events.keepalive_interval.count() == 0); // off by default
  CHECK(ok("[events]\nkeepalive_interval = \"2s\"\n").events.keepalive_interval ==
        std::chrono::seconds(2));
  CHECK(error_of("[events]\nkeepalive_interval = \"soon\"\n").key == "events.keepalive_interval");
}

TEST_CASE("sidecar.worker_threads: auto is 1, 2 with the cache server and an L2 tier") {
  CHECK(ok("").sidecar.worker_threads == 0);
  CHECK(scheduler_threads(ok("")) == 1);
  CHECK(scheduler_threads(ok("[cache]\nenabled = false\n")) == 1);
  CHECK(scheduler_threads(ok("[cache]\nenabled = true\n")) == 1);
  CHECK(scheduler_threads(ok("[cache]\nenabled = true\n[l2.disk]\nenabled = true\n"
                             "path = \"/tmp/kvs-l2\"\n")) == 2);
  CHECK(scheduler_threads(ok("[cache]\nenabled = false\n[l2.disk]\nenabled = true\n"
                             "path = \"/tmp/kvs-l2\"\n")) == 1);
  CHECK(scheduler_threads(ok("[sidecar]\nworker_threads = 3\n[cache]\nenabled = false\n")) == 3);
  auto bad = error_of("[sidecar]\n\nworker_threads = 65\n");
  CHECK(bad.key == "sidecar.worker_threads");
  CHECK(bad.line == 3);
  CHECK(bad.what == "expected an integer in 0..64, got 65");
  CHECK(error_of("", {"sidecar.worker_threads=-1"}).key == "sidecar.worker_threads");
}

TEST_CASE("sidecar.io_nice: -5 by default, -20..0 (only a higher priority than the process's)") {
  CHECK(ok("").sidecar.io_nice == -5);
  CHECK(ok("[sidecar]\nio_nice = 0\n").sidecar.io_nice == 0);
  CHECK(ok("[sidecar]\nio_nice = -20\n").sidecar.io_nice == -20);
  auto bad = error_of("[sidecar]\nio_nice = 1\n");
  CHECK(bad.key == "sidecar.io_nice");
  CHECK(bad.line == 2);
  CHECK(bad.what == "expected an integer in -20..0, got 1");
  CHECK(error_of("", {"sidecar.io_nice=-21"}).key == "sidecar.io_nice");
}

TEST_CASE("every socket's high-water mark is bounded; the ingest's frame limit is sane") {
  // 0 would mean "unbounded" to ZeroMQ: refused for every HWM key.
  for (auto key : {"events.hwm", "events.ingest_hwm", "events.replay_hwm", "cache.hwm"}) {
    auto e = error_of("", {std::string{key} + "=0"});
    CHECK(e.key == key);
    CHECK(e.what.find("got 0") != std::string::npos);
  }
  auto e = error_of("[events]\n\ningest_max_message_size = \"100B\"\n");
  CHECK(e.key == "events.ingest_max_message_size");
  CHECK(e.line == 3);
  CHECK(e.what.find("at least 1024 bytes") != std::string::npos);
  CHECK(error_of("", {"events.ingest_max_message_size=\"2TiB\""}).what == "expected at most 1TiB");
  auto q = error_of("", {"events.max_queue_bytes=\"1KiB\""});
  CHECK(q.key == "events.max_queue_bytes");
  CHECK(q.what.find("at least 1048576 bytes") != std::string::npos);
  auto c = ok("", {"events.ingest_max_message_size=\"4KiB\"", "cache.hwm=5"});
  CHECK(c.events.ingest_max_message_size == 4096);
  CHECK(c.cache.hwm == 5);
}

TEST_CASE("instance liveness: LMCache's two timeouts, 0 turns reaping off") {
  auto off = ok("[cache]\nheartbeat_timeout = \"0s\"\nregistration_grace = \"0s\"\n");
  CHECK(off.cache.heartbeat_timeout.count() == 0);
  auto fast = ok("", {"cache.heartbeat_timeout=500ms", "cache.registration_grace=2s"});
  CHECK(fast.cache.heartbeat_timeout == std::chrono::milliseconds{500});
  CHECK(fast.cache.registration_grace == std::chrono::seconds{2});
  // The grace of a never-pinged instance is at least the heartbeat timeout.
  auto e = error_of("[cache]\nregistration_grace = \"10s\"\n");
  CHECK(e.key == "cache.registration_grace");
  CHECK(e.line == 2);
  CHECK(e.what.find("at least cache.heartbeat_timeout (120s)") != std::string::npos);
  e = error_of("[cache]\nheartbeat_timeout = \"2h\"\n");
  CHECK(e.key == "cache.registration_grace");
  e = error_of("[cache]\nregistration_grace = \"soon\"\n");
  CHECK(e.key == "cache.registration_grace");
  CHECK(e.what.find("duration") != std::string::npos);
}

TEST_CASE("--set errors name the key") {
  auto e = error_of("", {"events.nope=1"});
  CHECK(e.source == "--set");
  CHECK(e.key == "events.nope");
  e = error_of("", {"cache.chunk_size=abc"});
  CHECK(e.key == "cache.chunk_size");
  e = error_of("", {"novalue"});
  CHECK(e.source == "--set");
}

TEST_CASE("invalid TOML reports the line") {
  auto e = error_of("[events]\nformat = \n");
  CHECK(e.line == 2);
  CHECK(e.what.find("not valid TOML") != std::string::npos);
}

TEST_CASE("load_config reads files and reports unreadable ones") {
  auto path = std::string{"/tmp/kvs_test_config.toml"};
  {
    std::ofstream out{path};
    out << "[cache]\nchunk_size = 512\n";
  }
  auto r = load_config(path, {});
  REQUIRE(r);
  CHECK(r->cache.chunk_size == 512);
  std::remove(path.c_str());
  auto missing = load_config("/nonexistent/kvs.toml", {});
  REQUIRE_FALSE(missing);
  CHECK(missing.error_value().kind == "io");
  CHECK(missing.error_value().detail == "config error: /nonexistent/kvs.toml: cannot read the file");
}

TEST_CASE("units") {
  CHECK(parse_size("512MiB") == (uint64_t{512} << 20));
  CHECK(parse_size("4GiB") == (uint64_t{4} << 30));
  CHECK(parse_size("1KB") == 1000u);
  CHECK(parse_size("1024") == 1024u);
  CHECK_FALSE(parse_size("4XB"));
  CHECK_FALSE(parse_size("-1MiB"));
  CHECK_FALSE(parse_size("MiB"));
  CHECK(parse_duration("250ms") == std::chrono::milliseconds{250});
  CHECK(parse_duration("10s") == std::chrono::seconds{10});
  CHECK(parse_duration("1.5s") == std::chrono::milliseconds{1500});
  CHECK(parse_duration("2m") == std::chrono::minutes{2});
  CHECK_FALSE(parse_duration("10"));
  CHECK_FALSE(parse_duration("10 parsecs"));
  CHECK(to_string(std::chrono::milliseconds{250}) == "250ms");
}

TEST_CASE("endpoint offsets follow vLLM's rule") {
  CHECK(offset_endpoint("tcp://*:5557", 0).value() == "tcp://*:5557");
  CHECK(offset_endpoint("tcp://*:5557", 2).value() == "tcp://*:5559");
  CHECK(offset_endpoint("tcp://127.0.0.1:5557", 1).value() == "tcp://127.0.0.1:5558");
  CHECK(offset_endpoint("inproc://cache", 1).value() == "inproc://cache_dp1");
  CHECK(offset_endpoint("ipc:///tmp/kv", 3).value() == "ipc:///tmp/kv_dp3");
  CHECK(offset_endpoint("tcp://*:0", 3).value() == "tcp://*:0");
  auto too_far = offset_endpoint("tcp://*:65535", 1);
  REQUIRE_FALSE(too_far);
  CHECK(too_far.error_value().detail.find("65535") != std::string::npos);
  CHECK(endpoint_binds("tcp://*:1"));
  CHECK(endpoint_binds("tcp://[::]:1"));
  CHECK(endpoint_binds("ipc:///tmp/x"));
  CHECK(endpoint_binds("inproc://x"));
  CHECK_FALSE(endpoint_binds("tcp://0.0.0.0:5557")); // the known trap: connects
}

TEST_CASE("cache.shm_allow_prefixes: an array of name starts") {
  auto c = ok("[cache]\nshm_allow_prefixes = [\"/tenant_a_\", \"\"]\n");
  CHECK(c.cache.shm_allow_prefixes == std::vector<std::string>{"/tenant_a_", ""});
  CHECK(ok("[cache]\nshm_allow_prefixes = []\n").cache.shm_allow_prefixes.empty());
  auto e = error_of("[cache]\nshm_allow_prefixes = \"/kvs_\"\n");
  CHECK(e.key == "cache.shm_allow_prefixes");
  CHECK(e.what == "expected an array, got a string");
  e = error_of("[cache]\n\nshm_allow_prefixes = [\"/a/b\"]\n");
  CHECK(e.key == "cache.shm_allow_prefixes");
  CHECK(e.line == 3);
  CHECK(e.what.find("element 0 (\"/a/b\")") == 0);
  e = error_of("[cache]\nshm_allow_prefixes = [\"/ok\", 3]\n");
  CHECK(e.what == "expected an array of strings, element 1 is not a string");
}

TEST_CASE("endpoint_is_local: loopback, ipc and inproc only") {
  CHECK(endpoint_is_local("tcp://127.0.0.1:5555"));
  CHECK(endpoint_is_local("tcp://localhost:5555"));
  CHECK(endpoint_is_local("tcp://[::1]:5555"));
  CHECK(endpoint_is_local("ipc:///run/kvs/cache.sock"));
  CHECK_FALSE(endpoint_is_local("tcp://*:5555"));
  CHECK_FALSE(endpoint_is_local("tcp://0.0.0.0:5555"));
  CHECK_FALSE(endpoint_is_local("tcp://10.0.0.7:5555"));
  CHECK_FALSE(endpoint_is_local("tcp://eth0:5555"));
}

namespace {

// ZeroMQ's documented example key pairs (zmq_curve(7)).
const char* const client_public = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";
const char* const server_secret = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6";

std::string hex(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    out += "0123456789abcdef"[c >> 4], out += "0123456789abcdef"[c & 15];
  return out;
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream out{path};
  out << text;
  return path;
}

} // namespace

TEST_CASE("Z85 CURVE keys: raw and zcert files") {
  REQUIRE(z85_decode_key(client_public));
  CHECK(hex(*z85_decode_key(client_public))
        == "bb88471d65e2659b30c55a5321cebb5aab2b70a398645c26dca2b2fcb43fc518");
  CHECK_FALSE(z85_decode_key("short"));
  CHECK_FALSE(z85_decode_key(std::string(39, '0') + "~")); // not in the alphabet
  auto raw = write_file("/tmp/kvs_test_curve_raw.key", std::string{"  "} + server_secret + "\n");
  auto k = read_curve_key(raw, true);
  REQUIRE_MESSAGE(k, (k ? "" : k.error_value().detail));
  CHECK(hex(*k) == "8e0bdd697628b91d8f245587ee95c5b04d48963f79259877b49cd9063aead3b7");
  auto zcert = write_file("/tmp/kvs_test_curve.zcert",
                          std::string{"#   ****  Generated by zmq  ****\nmetadata\ncurve\n"
                                      "    public-key = \""} + client_public + "\"\n");
  k = read_curve_key(zcert, false);
  REQUIRE_MESSAGE(k, (k ? "" : k.error_value().detail));
  CHECK(hex(*k).substr(0, 8) == "bb88471d");
  auto no_secret = read_curve_key(zcert, true); // no secret-key line
  REQUIRE_FALSE(no_secret);
  CHECK(no_secret.error_value().detail.find("secret-key") != std::string::npos);
  std::remove(raw.c_str());
  std::remove(zcert.c_str());
}

TEST_CASE("[security]: CURVE keys are loaded and validated, errors name the key") {
  std::string dir = "/tmp/kvs_test_curve_clients";
  std::string mk = "mkdir -p " + dir;
  REQUIRE(std::system(mk.c_str()) == 0);
  write_file(dir + "/engine.key", client_public);
  auto secret = write_file("/tmp/kvs_test_curve_server.key", server_secret);
  auto c = ok("", {"security.curve_secret_key_file=" + secret,
                   "security.curve_allowed_clients_dir=" + dir});
  CHECK(c.security.curve_enabled());
  CHECK(c.security.curve_secret_key.size() == 32);
  REQUIRE(c.security.curve_allowed_keys.size() == 1);
  CHECK(hex(c.security.curve_allowed_keys[0]).substr(0, 8) == "bb88471d");

  auto e = error_of("[security]\ncurve_secret_key_file = \"" + secret + "\"\n");
  CHECK(e.key == "security.curve_secret_key_file");
  CHECK(e.line == 2);
  CHECK(e.what == "CURVE also needs security.curve_allowed_clients_dir (set both, or neither)");
  e = error_of("[security]\ncurve_secret_key_file = \"/nonexistent/k\"\n"
               "curve_allowed_clients_dir = \"" + dir + "\"\n");
  CHECK(e.key == "security.curve_secret_key_file");
  CHECK(e.line == 2);
  CHECK(e.what == "cannot read \"/nonexistent/k\"");
  write_file(dir + "/broken.key", "not a key");
  e = error_of("", {"security.curve_secret_key_file=" + secret,
                    "security.curve_allowed_clients_dir=" + dir});
  CHECK(e.key == "security.curve_allowed_clients_dir");
  CHECK(e.what.find("broken.key") != std::string::npos);
  e = error_of("", {"security.curve_secret_key_file=" + secret,
                    "security.curve_allowed_clients_dir=/nonexistent/dir"});
  CHECK(e.what == "cannot open the directory \"/nonexistent/dir\"");
  std::string rm = "rm -rf " + dir + " " + secret;
  CHECK(std::system(rm.c_str()) == 0);
}

TEST_CASE("[http]: enabled and listen, validated") {
  auto c = ok("");
  CHECK(c.http.enabled);
  CHECK(c.http.listen == "127.0.0.1:9090"); // loopback: the control plane changes state
  CHECK(ok("[http]\nlisten = \"127.0.0.1:19090\"\n").http.listen == "127.0.0.1:19090");
  CHECK_FALSE(ok("", {"http.enabled=false"}).http.enabled);
  for (auto v6 : {"[::]:9090", "[::1]:9090", "[fd00::2]:19090"})
    CHECK(ok(std::string{"[http]\nlisten = \""} + v6 + "\"\n").http.listen == v6);
  for (auto bad : {"9090", "localhost:9090", "0.0.0.0:0", "0.0.0.0:70000", "1.2.3:80",
                   "1.2.3.256:80", "::1:9090", "[::1:9090", "[zz::]:9090", "[]:9090",
                   "0.0.0.0:90x", ":9090", "0.0.0.0:"}) {
    auto e = error_of(std::string{"[http]\nlisten = \""} + bad + "\"\n");
    CHECK_MESSAGE(e.key == "http.listen", bad);
    CHECK(e.line == 2);
    CHECK(e.what.find(bad) != std::string::npos);
  }
  CHECK(error_of("[http]\nenabled = \"yes\"\n").key == "http.enabled");
}

TEST_CASE("control plane keys: quota_mode, [cache.quotas], http.admin_token, /config's JSON") {
  auto d = ok("");
  CHECK_FALSE(d.cache.quota_isolated);
  CHECK(d.cache.quotas.empty());
  CHECK(d.http.admin_token.empty());
  auto c = ok("[cache]\nquota_mode = \"isolated\"\n[cache.quotas]\ntenant-a = \"2GiB\"\n"
              "_default = \"1MiB\"\n[http]\nadmin_token = \"0123456789abcdef\"\n"
              "[l2.redis]\npassword = \"hunter2-secret\"\n");
  CHECK(c.cache.quota_isolated);
  REQUIRE(c.cache.quotas.size() == 2);
  // "_default" is the empty salt; toml++ keeps keys in order.
  CHECK(c.cache.quotas[0] == std::pair<std::string, uint64_t>{"", uint64_t{1} << 20});
  CHECK(c.cache.quotas[1] == std::pair<std::string, uint64_t>{"tenant-a", uint64_t{2} << 30});
  CHECK(c.http.admin_token == "0123456789abcdef");
  // Secrets never reach GET /config.
  CHECK(c.effective_json.find("hunter2") == std::string::npos);
  CHECK(c.effective_json.find("0123456789abcdef") == std::string::npos);
  CHECK(c.effective_json.find("<redacted>") != std::string::npos);
  CHECK(c.effective_json.find("\"tenant-a\"") != std::string::npos);
  auto e = error_of("[cache.quotas]\n\"a@b\" = \"1GiB\"\n");
  CHECK(e.key == "cache.quotas.a@b");
  CHECK(e.what.find("'@'") != std::string::npos);
  CHECK(error_of("[cache.quotas]\nt = \"lots\"\n").key == "cache.quotas.t");
  CHECK(error_of("[cache.quotas]\nt = 5\n").key == "cache.quotas.t");
  CHECK(error_of("[cache]\nquota_mode = \"strict\"\n").key == "cache.quota_mode");
  CHECK(error_of("[http]\nadmin_token = \"short\"\n").key == "http.admin_token");
}

TEST_CASE("[l2]: defaults, nested sections keep their defaults, --set reaches them") {
  auto d = ok("");
  CHECK(d.l2.queue_bytes == (uint64_t{1} << 30));
  CHECK_FALSE(d.l2.disk.enabled);
  CHECK(d.l2.disk.size == (uint64_t{100} << 30));
  CHECK_FALSE(d.l2.redis.enabled);
  CHECK(d.l2.redis.endpoints == std::vector<std::string>{"127.0.0.1:6379"});
  CHECK(d.l2.redis.ttl.count() == 0);
  CHECK(d.l2.redis.connections == 1);
  CHECK(d.l2.redis.timeout == std::chrono::seconds{1});
  CHECK_FALSE(d.l2.enabled());

  auto c = ok("[l2.disk]\nenabled = true\npath = \"/tmp/x\"\n"
              "[l2.redis]\nenabled = true\nendpoints = [\"10.0.0.1:7000\", \"[::1]:7001\"]\n"
              "cluster = true\nttl = \"1h\"\n",
              {"l2.redis.password=pw", "l2.queue_bytes=\"64MiB\""});
  CHECK(c.l2.disk.enabled);
  CHECK(c.l2.disk.path == "/tmp/x");
  CHECK(c.l2.disk.size == (uint64_t{100} << 30)); // untouched key of a touched subtable
  CHECK(c.l2.redis.endpoints == std::vector<std::string>{"10.0.0.1:7000", "[::1]:7001"});
  CHECK(c.l2.redis.cluster);
  CHECK(c.l2.redis.ttl == std::chrono::hours{1});
  CHECK(c.l2.redis.password == "pw");
  CHECK(c.l2.redis.timeout == std::chrono::seconds{1});
  CHECK(c.l2.queue_bytes == (uint64_t{64} << 20));
  CHECK(c.l2.enabled());
}

TEST_CASE("[l2]: every bad key is named with its line") {
  auto e = error_of("[l2.disk]\nenabled = true\npath = \"\"\n");
  CHECK(e.key == "l2.disk.path");
  CHECK(e.line == 3);
  e = error_of("[l2.disk]\nsize = \"lots\"\n");
  CHECK(e.key == "l2.disk.size");
  CHECK(e.line == 2);
  e = error_of("[l2.disk]\nsizes = \"1GiB\"\n");
  CHECK(e.key == "l2.disk.sizes");
  CHECK(e.what == "unknown key");
  e = error_of("[l2.redis]\nendpoints = [\"redis:0\"]\n");
  CHECK(e.key == "l2.redis.endpoints");
  CHECK(e.what.find("redis:0") != std::string::npos);
  e = error_of("[l2.redis]\nendpoints = [\"nohost\"]\n");
  CHECK(e.key == "l2.redis.endpoints");
  e = error_of("[l2.redis]\nendpoints = [1]\n");
  CHECK(e.what == "expected a list of strings");
  e = error_of("[l2.redis]\nendpoints = \"a:1\"\n");
  CHECK(e.what == "expected an array, got a string");
  e = error_of("[l2.redis]\nenabled = true\nendpoints = []\n");
  CHECK(e.key == "l2.redis.endpoints");
  e = error_of("[l2.redis]\nconnections = 0\n");
  CHECK(e.key == "l2.redis.connections");
  e = error_of("[l2.redis]\ntimeout = \"0s\"\n");
  CHECK(e.key == "l2.redis.timeout");
  e = error_of("[l2.redis]\nttl = \"soon\"\n");
  CHECK(e.key == "l2.redis.ttl");
  e = error_of("[l2]\nqueue_bytes = \"1KiB\"\n");
  CHECK(e.key == "l2.queue_bytes");
  e = error_of("", {"l2.redis.nope=1"});
  CHECK(e.key == "l2.redis.nope");
  CHECK(e.source == "--set");
  e = error_of("[l2]\ndisk = 3\n");
  CHECK(e.key == "l2.disk");
  CHECK(e.what == "expected a table, got an integer");
}

TEST_CASE("[l2] format: kvsidecar by default, lmcache when asked, anything else named") {
  CHECK(ok("").l2.format == l2_format::kvsidecar);
  CHECK(ok("[l2]\nformat = \"lmcache\"\n").l2.format == l2_format::lmcache);
  CHECK(ok("", {"l2.format=\"lmcache\""}).l2.format == l2_format::lmcache);
  auto e = error_of("[l2]\nformat = \"lmcache-0.5\"\n");
  CHECK(e.key == "l2.format");
  CHECK(e.line == 2);
  CHECK(e.what.find("\"kvsidecar\", \"lmcache\"") != std::string::npos);
}
