// subscribe_kv_events: the replay log's read rules (LMCache 0.5.6's
// read_kv_events), the stream's credit / end rules, and the batch encoding.
#include <doctest/doctest.h>

#include <msgpack.hpp>

#include "actors/cache/kv_event_streams.hpp"
#include "lmcache_wire/lmcache_ops.hpp"

using namespace kvs;

namespace {

kv_event_record stored(const std::string& model, uint64_t h, std::optional<uint64_t> parent = {}) {
  kv_event_record r;
  r.model_name = model;
  r.block_hashes = {h};
  r.parent_block_hash = parent;
  r.token_ids = {1, 2, 3};
  return r;
}

kv_event_record removed(const std::string& model, std::vector<uint64_t> hs) {
  kv_event_record r;
  r.stored = false;
  r.model_name = model;
  r.block_hashes = std::move(hs);
  return r;
}

std::vector<uint64_t> seqs(const kv_event_batch_out& b) {
  std::vector<uint64_t> out;
  for (auto* r : b.events) out.push_back(r->seq);
  return out;
}

/// A decoded batch frame: the top-level map, keyed by field name.
struct decoded {
  msgpack::object_handle oh;
  std::map<std::string, msgpack::object> f;
  explicit decoded(const std::string& frame) {
    oh = msgpack::unpack(frame.data(), frame.size());
    for (auto& kv : oh.get().as<std::map<std::string, msgpack::object>>()) f.emplace(kv);
  }
};

} // namespace

TEST_CASE("log: cursor, model filter, page size, trimming and loss") {
  kv_event_log log(4, 77);
  auto b = log.read("m", 0, 10);
  CHECK(b.enabled);
  CHECK(b.incarnation == 77);
  CHECK_FALSE(b.lost);
  CHECK(b.next_cursor == 0);
  CHECK(b.events.empty());
  log.append(stored("m", 1));
  log.append(stored("other", 2));
  log.append(stored("m", 3));
  b = log.read("m", 0, 10);
  CHECK(seqs(b) == std::vector<uint64_t>{1, 3});
  CHECK(b.next_cursor == 3);
  // Page size: stops at the max_events-th record of the model.
  b = log.read("m", 0, 1);
  CHECK(seqs(b) == std::vector<uint64_t>{1});
  CHECK(b.next_cursor == 1);
  // Records of other models still advance the cursor.
  b = log.read("other", 2, 10);
  CHECK(b.events.empty());
  CHECK(b.next_cursor == 3);
  // Trimmed past the cursor: lost, and the rest is still read.
  log.append(stored("m", 4));
  log.append(removed("m", {1, 3}));  // seq 5; seq 1 is trimmed (capacity 4)
  b = log.read("m", 0, 10);
  CHECK(b.lost);
  CHECK(seqs(b) == std::vector<uint64_t>{3, 4, 5});
  CHECK_FALSE(log.read("m", 1, 10).lost);  // seq 2 is still there
  // A cursor from the future (another incarnation): lost, cursor clamped.
  b = log.read("m", 99, 10);
  CHECK(b.lost);
  CHECK(b.next_cursor == 5);
  // Disabled.
  kv_event_log off(0, 1);
  off.append(stored("m", 1));
  CHECK_FALSE(off.read("m", 0, 10).enabled);
  CHECK(off.size() == 0);
}

TEST_CASE("stream: status first, then one batch per ack when there is news; end frames") {
  std::vector<mp_reply> sent;
  kv_event_streams s(100, 5, std::chrono::seconds(1), [&](const mp_reply& r) { sent.push_back(r); });
  auto t0 = kv_event_streams::clock::now();
  subscribe_kv_events_req q{7, "m", 0, 2};
  s.subscribe("peer", "\x01", "op", q, t0);
  REQUIRE(sent.size() == 1);  // the status batch, at once
  {
    decoded d(*sent[0].body);
    CHECK(d.f.at("enabled").as<bool>());
    CHECK(d.f.at("incarnation").as<int64_t>() == 5);
    CHECK(d.f.at("next_cursor").as<uint64_t>() == 0);
    CHECK_FALSE(d.f.at("lost").as<bool>());
    CHECK(d.f.at("events").via.array.size == 0);
  }
  CHECK(sent[0].identity == "peer");
  CHECK(sent[0].uid_frame == "\x01");
  CHECK(sent[0].op_frame == "op");
  // No credit until the client acks.
  s.append({stored("m", 0x0102030405060708ull, 0x1111), stored("m", 2), stored("m", 3)});
  CHECK(sent.size() == 1);
  CHECK(s.control("peer", "\x01", "ack"));
  REQUIRE(sent.size() == 2);
  {
    decoded d(*sent[1].body);
    CHECK(d.f.at("next_cursor").as<uint64_t>() == 2);  // page of 2
    auto ev = d.f.at("events").via.array;
    REQUIRE(ev.size == 2);
    auto r = ev.ptr[0].as<std::map<std::string, msgpack::object>>();
    CHECK(r.at("seq").as<uint64_t>() == 1);
    CHECK(r.at("kind").as<std::string>() == "stored");
    CHECK(r.at("medium").as<std::string>() == "CPU");
    CHECK(r.at("model_name").as<std::string>() == "m");
    auto h = r.at("block_hashes").via.array.ptr[0];
    REQUIRE(h.type == msgpack::type::BIN);
    CHECK(std::string(h.via.bin.ptr, h.via.bin.size) == "\x01\x02\x03\x04\x05\x06\x07\x08");
    auto p = r.at("parent_block_hash");
    REQUIRE(p.type == msgpack::type::BIN);
    CHECK(std::string(p.via.bin.ptr, p.via.bin.size) == std::string("\0\0\0\0\0\0\x11\x11", 8));
    CHECK(r.at("token_ids").as<std::vector<int64_t>>() == std::vector<int64_t>{1, 2, 3});
    auto r2 = ev.ptr[1].as<std::map<std::string, msgpack::object>>();
    CHECK(r2.at("parent_block_hash").is_nil());
  }
  // The third record goes out on the next ack.
  CHECK(s.control("peer", "\x01", "ack"));
  REQUIRE(sent.size() == 3);
  CHECK(decoded(*sent[2].body).f.at("next_cursor").as<uint64_t>() == 3);
  // Acked with nothing new: nothing sent until a record of its model comes.
  CHECK(s.control("peer", "\x01", "ack"));
  s.append({stored("other", 9)});
  CHECK(sent.size() == 3);
  s.append({removed("m", {2})});
  REQUIRE(sent.size() == 4);
  CHECK(decoded(*sent[3].body).f.at("next_cursor").as<uint64_t>() == 5);
  // Unknown stream controls are not ours.
  CHECK_FALSE(s.control("peer", "\x02", "ack"));
  CHECK_FALSE(s.control("other-peer", "\x01", "ack"));
  // PING keeps it; silence past the timeout ends it with a body-less frame.
  s.touch(7, t0 + std::chrono::milliseconds(900));
  CHECK(s.expire(t0 + std::chrono::milliseconds(1800)) == 0);
  CHECK(s.expire(t0 + std::chrono::milliseconds(2000)) == 1);
  REQUIRE(sent.size() == 5);
  CHECK_FALSE(sent[4].body.has_value());
  CHECK(s.subscribers() == 0);
}

TEST_CASE("stream: one per instance, cancel and reaping end it") {
  std::vector<mp_reply> sent;
  kv_event_streams s(100, 5, std::chrono::seconds(0), [&](const mp_reply& r) { sent.push_back(r); });
  auto now = kv_event_streams::clock::now();
  s.subscribe("a", "\x01", "op", {7, "m", 0, 8}, now);
  s.subscribe("a", "\x02", "op", {7, "m", 0, 8}, now);  // replaces: the old one ends
  REQUIRE(sent.size() == 3);
  CHECK(sent[1].uid_frame == "\x01");
  CHECK_FALSE(sent[1].body.has_value());
  CHECK(sent[2].uid_frame == "\x02");
  CHECK(s.subscribers() == 1);
  CHECK(s.expire(now + std::chrono::hours(1)) == 0);  // idle timeout 0: never
  CHECK(s.control("a", "\x02", "cancel"));
  REQUIRE(sent.size() == 4);
  CHECK_FALSE(sent[3].body.has_value());
  s.subscribe("b", "\x03", "op", {8, "m", 0, 8}, now);
  s.drop_instance(8);
  REQUIRE(sent.size() == 6);
  CHECK_FALSE(sent[5].body.has_value());
  CHECK(s.subscribers() == 0);
}

TEST_CASE("stream: a disabled channel says so once, then ends") {
  std::vector<mp_reply> sent;
  kv_event_streams s(0, 5, std::chrono::seconds(0), [&](const mp_reply& r) { sent.push_back(r); });
  CHECK_FALSE(s.enabled());
  s.subscribe("a", "\x01", "op", {7, "m", 0, 8}, kv_event_streams::clock::now());
  REQUIRE(sent.size() == 1);
  CHECK_FALSE(decoded(*sent[0].body).f.at("enabled").as<bool>());
  CHECK(s.control("a", "\x01", "ack"));
  REQUIRE(sent.size() == 2);
  CHECK_FALSE(sent[1].body.has_value());
}

TEST_CASE("subscribe_kv_events request: op name and arguments") {
  auto enc = [](auto v) {
    msgpack::sbuffer b;
    msgpack::pack(b, v);
    return std::string(b.data(), b.size());
  };
  // The op frame resolves to the streamed row (which the engine bridge
  // opens); other names, a request op and ids do not.
  const auto* row = streamed_row(enc(std::string("subscribe_kv_events")));
  REQUIRE(row != nullptr);
  CHECK(row->op == mp_op::subscribe_kv_events);
  CHECK(streamed_row(enc(std::string("subscribe_kv_event"))) == nullptr);
  CHECK(streamed_row(enc(std::string("lookup"))) == nullptr);
  CHECK(streamed_row(enc(32)) == nullptr);
  CHECK(streamed_row("") == nullptr);
  std::vector<std::string> a{enc(7), enc(std::string("m")), enc(0), enc(64)};
  auto view = [](const std::vector<std::string>& v) {
    return std::vector<std::string_view>(v.begin(), v.end());
  };
  auto ok = decode_subscribe_kv_events(view(a));
  REQUIRE(ok.has_value());
  CHECK(ok.value().model_name == "m");
  CHECK(ok.value().max_events == 64);
  auto err = [&](std::vector<std::string> v) {
    auto r = decode_subscribe_kv_events(view(v));
    REQUIRE_FALSE(r.has_value());
    return r.error_value();
  };
  CHECK(err({enc(7)}).kind == "arity");
  CHECK(err({enc(7), enc(std::string("m")), enc(-1), enc(64)}).detail.find("cursor") != std::string::npos);
  CHECK(err({enc(7), enc(std::string("m")), enc(0), enc(0)}).detail.find("max_events") != std::string::npos);
  CHECK(err({enc(7), enc(std::string("m")), enc(0), enc(1025)}).kind == "bad_arg");
  CHECK(err({enc(std::string("x")), enc(std::string("m")), enc(0), enc(1)}).detail.find("instance_id") != std::string::npos);
  CHECK(err({enc(7), enc(3), enc(0), enc(1)}).detail.find("model_name") != std::string::npos);
  CHECK(err({enc(7), enc(std::string("m")) + "x", enc(0), enc(1)}).kind == "bad_arg");
  // Found by fuzz_lmcache_decode: an argument that declares a huge array
  // (array32 of 2^32-1 elements, 5 bytes) is refused without allocating for
  // it (an object-tree parser asked for 64 GiB here).
  const std::string huge_array{"\xdd\xff\xff\xff\xff", 5};
  CHECK(err({huge_array, enc(std::string("m")), enc(0), enc(1)}).detail.find("instance_id")
        != std::string::npos);
  CHECK(err({enc(7), huge_array, enc(0), enc(1)}).detail.find("model_name") != std::string::npos);
}
