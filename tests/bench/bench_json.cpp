// bench_json: the control plane's JSON (issue 44 item 3/7), the product's
// reader and writer (http/json_text: simdjson's On Demand, a hand-written
// writer) against nlohmann-json 3.11 and simdjson 3.0's DOM (Debian's
// nlohmann-json3-dev, libsimdjson-dev; nlohmann's cases are left out when it
// is not installed). Every parse extracts what
// the route reads (the fields, the token ids summed, the keys' ranks), so
// the three do the same work:
//   clear      POST /cache/clear     {"tier": "l1", "force": false}
//   quota      PUT /quota/{salt}     {"limit_gb": 1.5}
//   prefetch   POST /cache/prefetches, 2,048 token ids
//   delete     DELETE /cache/objects, 100 of LMCache's keys
//   status     the GET /status answer written (what probes and the CLI read)
// Run: build-bench/tests/bench_json --benchmark_repetitions=3 (-DKVSIDECAR_BENCH=ON).
#include "http/json_text.hpp"

#include <benchmark/benchmark.h>

#ifdef KVS_BENCH_NLOHMANN
#include <nlohmann/json.hpp>
#endif
#ifdef KVS_BENCH_SIMDJSON
#include <simdjson.h>
#endif

#include <cstdint>
#include <string>

namespace {

const std::string clear_body = R"({"tier": "l1", "force": false})";
const std::string quota_body = R"({"limit_gb": 1.5})";

std::string prefetch_body() {
  std::string s = R"({"model_name": "Qwen/Qwen3-8B", "world_size": 1, "cache_salt": "tenant-a", "token_ids": [)";
  for (int i = 0; i < 2048; ++i)
    s += (i ? ", " : "") + std::to_string(100000 + i * 37);
  return s + "]}";
}

std::string delete_body() {
  std::string s = R"({"tier": "l2", "keys": [)";
  for (int i = 0; i < 100; ++i)
    s += std::string{i ? ", " : ""} + R"({"chunk_hash_hex": "00112233445566778899aabbccddeeff00112233445566778899aabbccdd)"
         + std::to_string(1000 + i) + R"(", "model_name": "Qwen/Qwen3-8B", "kv_rank": )"
         + std::to_string(i % 4) + R"(, "object_group_id": 0, "cache_salt": ""})";
  return s + "]}";
}

const std::string prefetch = prefetch_body();
const std::string del = delete_body();

// -- the product's reader ---------------------------------------------------

uint64_t text_extract(const std::string& body) {
  auto o = kvs::parse_json_object(body);
  uint64_t out = o.members.size();
  if (auto* t = o.get("token_ids"))
    for (auto v : t->ints)
      out += static_cast<uint64_t>(v);
  if (auto* k = o.get("keys"))
    for (auto& key : k->objects) {
      if (auto* r = key.get("kv_rank"))
        out += static_cast<uint64_t>(r->n);
      if (auto* h = key.get("chunk_hash_hex"))
        out += h->s.size();
    }
  if (auto* l = o.get("limit_gb"))
    out += static_cast<uint64_t>(l->n * 2);
  if (auto* t = o.get("tier"))
    out += t->s.size();
  return out;
}

void json_text_parse(benchmark::State& st, const std::string* body) {
  for (auto _ : st)
    benchmark::DoNotOptimize(text_extract(*body));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * body->size()));
}

#ifdef KVS_BENCH_NLOHMANN
uint64_t nlohmann_extract(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return 0;
  uint64_t out = j.size();
  if (auto t = j.find("token_ids"); t != j.end())
    for (auto& v : *t)
      out += v.get<uint64_t>();
  if (auto k = j.find("keys"); k != j.end())
    for (auto& key : *k)
      out += key.at("kv_rank").get<uint64_t>() + key.at("chunk_hash_hex").get_ref<const std::string&>().size();
  if (auto l = j.find("limit_gb"); l != j.end())
    out += static_cast<uint64_t>(l->get<double>() * 2);
  if (auto t = j.find("tier"); t != j.end())
    out += t->get_ref<const std::string&>().size();
  return out;
}

void nlohmann_parse(benchmark::State& st, const std::string* body) {
  for (auto _ : st)
    benchmark::DoNotOptimize(nlohmann_extract(*body));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * body->size()));
}
#endif

#ifdef KVS_BENCH_SIMDJSON
uint64_t simdjson_extract(simdjson::dom::parser& p, const std::string& body) {
  // The body as the server holds it (not padded): simdjson copies it.
  simdjson::dom::object o;
  if (p.parse(body.data(), body.size(), true).get(o))
    return 0;
  uint64_t out = o.size();
  simdjson::dom::array a;
  if (!o["token_ids"].get(a))
    for (auto v : a)
      out += uint64_t(v.get_uint64().value_unsafe());
  if (!o["keys"].get(a))
    for (auto key : a) {
      out += uint64_t(key["kv_rank"].get_uint64().value_unsafe());
      out += std::string_view(key["chunk_hash_hex"].get_string().value_unsafe()).size();
    }
  double d;
  if (!o["limit_gb"].get(d))
    out += static_cast<uint64_t>(d * 2);
  std::string_view s;
  if (!o["tier"].get(s))
    out += s.size();
  return out;
}

void simdjson_parse(benchmark::State& st, const std::string* body) {
  simdjson::dom::parser p; // kept, as a server would keep one per thread
  for (auto _ : st)
    benchmark::DoNotOptimize(simdjson_extract(p, *body));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * body->size()));
}
#endif

// -- writing: GET /status's shape ---------------------------------------------

void json_text_status(benchmark::State& st) {
  for (auto _ : st) {
    kvs::json_writer w;
    w.begin_object().boolean("is_healthy", true).str("engine_type", "kvsidecar")
      .integer("chunk_size", 256).integer("active_sessions", 3)
      .begin_object("storage_manager").begin_object("l1_manager")
      .integer("memory_total_bytes", 1ull << 34).integer("memory_used_bytes", 123456789)
      .num("memory_usage_ratio", 0.0072).integer("total_object_count", 4096)
      .end_object().end_object()
      .begin_object("kvsidecar").str("version", "0.1.0").boolean("alive", true)
      .integer("stored_chunks_total", 987654).integer("lookups_total", 55555)
      .end_object().end_object();
    benchmark::DoNotOptimize(w.take());
  }
}

#ifdef KVS_BENCH_NLOHMANN
void nlohmann_status(benchmark::State& st) {
  for (auto _ : st) {
    nlohmann::json j;
    j["is_healthy"] = true;
    j["engine_type"] = "kvsidecar";
    j["chunk_size"] = 256;
    j["active_sessions"] = 3;
    auto& l1 = j["storage_manager"]["l1_manager"];
    l1["memory_total_bytes"] = 1ull << 34;
    l1["memory_used_bytes"] = 123456789;
    l1["memory_usage_ratio"] = 0.0072;
    l1["total_object_count"] = 4096;
    auto& k = j["kvsidecar"];
    k["version"] = "0.1.0";
    k["alive"] = true;
    k["stored_chunks_total"] = 987654;
    k["lookups_total"] = 55555;
    benchmark::DoNotOptimize(j.dump());
  }
}
#endif

} // namespace

BENCHMARK_CAPTURE(json_text_parse, clear, &clear_body);
BENCHMARK_CAPTURE(json_text_parse, quota, &quota_body);
BENCHMARK_CAPTURE(json_text_parse, prefetch, &prefetch);
BENCHMARK_CAPTURE(json_text_parse, delete, &del);
BENCHMARK(json_text_status);
#ifdef KVS_BENCH_NLOHMANN
BENCHMARK_CAPTURE(nlohmann_parse, clear, &clear_body);
BENCHMARK_CAPTURE(nlohmann_parse, quota, &quota_body);
BENCHMARK_CAPTURE(nlohmann_parse, prefetch, &prefetch);
BENCHMARK_CAPTURE(nlohmann_parse, delete, &del);
BENCHMARK(nlohmann_status);
#endif
#ifdef KVS_BENCH_SIMDJSON
BENCHMARK_CAPTURE(simdjson_parse, clear, &clear_body);
BENCHMARK_CAPTURE(simdjson_parse, quota, &quota_body);
BENCHMARK_CAPTURE(simdjson_parse, prefetch, &prefetch);
BENCHMARK_CAPTURE(simdjson_parse, delete, &del);
#endif

BENCHMARK_MAIN();
