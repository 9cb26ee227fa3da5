// coordinator_events: the POST /events body LMCache 0.5.6's coordinator
// parses (CacheEventsRequest; the integration test posts it to the real one: batches of one type and backend, seq numbered,
// keys in EncodedObjectKey form, a "config" batch per declared backend
// first), and the bounded queue that drops rather than waits.
#include "app/coordinator_events.hpp"

#include <doctest/doctest.h>

using namespace kvs;

namespace {
cache_event ev(bool stored, const char* backend, char hash_byte, const char* salt = "") {
  cache_event e;
  e.kind = stored ? cache_event_kind::store : cache_event_kind::remove;
  e.backend = backend;
  e.key = object_key_fields{"org/model", 0x01000100, 0, std::string(32, hash_byte), salt};
  e.size_bytes = 65536;
  return e;
}
} // namespace

TEST_CASE("consecutive events of one type and backend share a batch, seq from the cursor") {
  std::vector<cache_event> events{ev(true, "fs", 1), ev(true, "fs", 2), ev(false, "fs", 1),
                                  ev(true, "resp", 3, "t")};
  uint64_t batches = 0;
  auto body = coordinator_events::encode(events, "mp-1", 1700000000, 7, 12.5, &batches);
  CHECK(batches == 3);
  CHECK(body.rfind(R"({"batches":[{)", 0) == 0); // flush() splices a declaration in after it
  CHECK(body.substr(body.size() - 5) == "}]}]}");
  CHECK(body.find(R"("seq":8,"event_type":"store","tier":"l2","backend":"fs")") != std::string::npos);
  CHECK(body.find(R"("seq":9,"event_type":"delete")") != std::string::npos);
  CHECK(body.find(R"("seq":10,"event_type":"store","tier":"l2","backend":"resp")") != std::string::npos);
  CHECK(body.find(R"("instance_id":"mp-1","incarnation":1700000000)") != std::string::npos);
  // LMCache's EncodedObjectKey: hex chunk hash, packed kv_rank as a number.
  std::string hex01;
  for (int i = 0; i < 32; ++i)
    hex01 += "01";
  CHECK(body.find(R"({"key":{"chunk_hash_hex":")" + hex01
                  + R"(","model_name":"org/model","kv_rank":16777472,"object_group_id":0,)"
                  + R"("cache_salt":""},"size_bytes":65536})") != std::string::npos);
  // A delete carries no size.
  CHECK(body.find(R"("size_bytes":0)") != std::string::npos);
  CHECK(body.find(R"("cache_salt":"t")") != std::string::npos);
}

TEST_CASE("a read-back is an access batch of its own, sizeless, on its backend") {
  auto read = ev(true, "fs", 4);
  read.kind = cache_event_kind::access;
  uint64_t batches = 0;
  auto body = coordinator_events::encode({ev(true, "fs", 4), read, read}, "mp-1", 1, 0, 1.0,
                                         &batches);
  CHECK(batches == 2);
  CHECK(body.find(R"("seq":2,"event_type":"access","tier":"l2","backend":"fs","shared":false)")
        != std::string::npos);
  // The access batch's two entries carry no size (LMCache's CacheEventEntry default).
  auto access = body.substr(body.find(R"("event_type":"access")"));
  size_t zeros = 0;
  for (size_t at = access.find(R"("size_bytes":0})"); at != std::string::npos;
       at = access.find(R"("size_bytes":0})", at + 1))
    ++zeros;
  CHECK(zeros == 2);
}

TEST_CASE("a capacity declaration: one config batch per backend, no entries") {
  auto s = coordinator_events::encode_capacity({{"fs", false, 16u << 20}, {"resp", true, 0}},
                                               "mp-1", 5, 0, 3, 1.0);
  CHECK(s == R"({"instance_id":"mp-1","incarnation":5,"seq":1,"event_type":"config","tier":"l2",)"
             R"("backend":"fs","shared":false,"ts":1.0,"capacity_bytes":16777216,)"
             R"("capacity_revision":3},{"instance_id":"mp-1","incarnation":5,"seq":2,)"
             R"("event_type":"config","tier":"l2","backend":"resp","shared":true,"ts":1.0,)"
             R"("capacity_bytes":0,"capacity_revision":3})");
}

TEST_CASE("L1's declaration and events name tier l1, as LMCache's L1 medium") {
  auto s = coordinator_events::encode_capacity({{"dram", false, 64u << 20, true}}, "mp-1", 5, 0,
                                               1, 1.0);
  CHECK(s.find(R"("event_type":"config","tier":"l1","backend":"dram")") != std::string::npos);
  auto placed = ev(true, "dram", 5);
  placed.l1 = true;
  auto read = placed;
  read.kind = cache_event_kind::access;
  read.backend = "";
  uint64_t batches = 0;
  auto body = coordinator_events::encode({placed, ev(true, "dram", 6), read}, "mp-1", 1, 0, 1.0,
                                         &batches);
  // The same type and backend on another tier is another batch.
  CHECK(batches == 3);
  CHECK(body.find(R"("seq":1,"event_type":"store","tier":"l1","backend":"dram")")
        != std::string::npos);
  CHECK(body.find(R"("seq":2,"event_type":"store","tier":"l2","backend":"dram")")
        != std::string::npos);
  CHECK(body.find(R"("seq":3,"event_type":"access","tier":"l1","backend":"")")
        != std::string::npos);
}

TEST_CASE("offer never waits: past queue_max the event is dropped and counted") {
  // No instance id and nobody at the URL: nothing leaves the queue.
  coordinator_events r{"http://127.0.0.1:9", "", std::chrono::milliseconds{50}, 2, {}, "test"};
  for (char i = 0; i < 5; ++i)
    r.offer(ev(true, "fs", i));
  auto f = r.read();
  CHECK(f.queued == 2);
  CHECK(f.dropped == 3);
  CHECK(f.posted == 0);
}
