// LMCache's gRPC messages <-> ZeroMQ frames (lmcache_grpc/grpc_transcode.hpp):
// the frames a gRPC request becomes decode, with the shared decoder, to the
// request a ZeroMQ client of the same release sends; replies come back as
// the RPC's response messages, parsed here with the protos' own classes.
#include <doctest/doctest.h>

#include "lmcache_grpc/grpc_methods.hpp"
#include "lmcache_grpc/grpc_transcode.hpp"
#include "lmcache_wire/lmcache_failure.hpp"
#include "lmcache_wire/lmcache_kv_events.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include "engine_driven_service.pb.h"
#include "kv_event_service.pb.h"
#include "lmcache_driven_service.pb.h"
#include "lookup_service.pb.h"
#include "management_service.pb.h"

#include <optional>
#include <string>
#include <vector>

using namespace kvs;
namespace pb = lmcache::mp;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int v : b)
    s.push_back(static_cast<char>(v));
  return s;
}

/// The frames of `path` for `msg`, decoded as the engine bridge decodes a
/// ZeroMQ request.
template <class Message>
mp_request decoded(std::string_view path, const Message& msg,
                   client_release dialect = client_release::unknown) {
  const auto* m = find_grpc_method(path);
  REQUIRE(m != nullptr);
  auto frames = grpc_request_frames(*m, msg.SerializeAsString(), dialect, 7);
  REQUIRE_MESSAGE(frames, (frames ? "" : frames.error_value().detail));
  std::vector<std::string_view> views(frames->begin(), frames->end());
  auto req = decode_mp_request(views);
  REQUIRE_MESSAGE(req, (req ? "" : req.error_value().detail));
  CHECK(grpc_call_id(req->uid_frame) == 7u);
  return std::move(*req);
}

pb::IpcCacheServerKey key(std::string tokens_field, int64_t end) {
  pb::IpcCacheServerKey k;
  k.set_model_name("m");
  k.set_world_size(1);
  k.set_token_bytes(std::move(tokens_field));
  k.set_end(end);
  k.set_request_id("r");
  k.set_num_kv_readers(1);
  return k;
}

// Tokens [1, 2, 3, 300, 70000] as each release's generated client encodes
// them (LMCache's common_pb2, field 4: 0.5.6 packed varints, 0.5.7 BE uint32).
const std::string tokens_056 = bytes({0x01, 0x02, 0x03, 0xac, 0x02, 0xf0, 0xa2, 0x04});
const std::string tokens_057 = bytes({0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 1, 0x2c, 0, 1, 0x11, 0x70});
const std::vector<uint32_t> tokens_expected{1, 2, 3, 300, 70000};

} // namespace

TEST_CASE("grpc methods: both releases' services, one table") {
  const auto* a = find_grpc_method("/lmcache.mp.ControllerService/GetChunkSize");
  const auto* b = find_grpc_method("/lmcache.mp.ManagementService/GetChunkSize");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->op == mp_op::get_chunk_size);
  CHECK(a->release == client_release::v0_5_6);
  CHECK(b->release == client_release::v0_5_7);
  const auto* l = find_grpc_method("/lmcache.mp.LookupService/Lookup");
  REQUIRE(l);
  CHECK(l->release == client_release::unknown);
  const auto* s = find_grpc_method("/lmcache.mp.KVEventService/SubscribeKvEvents");
  REQUIRE(s);
  CHECK(s->subscribe);
  CHECK(op_name(*s) == "subscribe_kv_events");
  CHECK(find_grpc_method("/lmcache.mp.BlendService/CbRegisterRope") == nullptr);
  CHECK(find_grpc_method("") == nullptr);
  CHECK(find_grpc_method("/lmcache.mp.LookupService/Lookup/") == nullptr);
}

TEST_CASE("grpc lookup: each release's token field decodes to the same tokens") {
  pb::LookupRequest r56;
  *r56.mutable_key() = key(tokens_056, 5);
  r56.set_tp_size(1);
  auto q56 = decoded("/lmcache.mp.LookupService/Lookup", r56, client_release::v0_5_6);
  CHECK(q56.op == mp_op::lookup);
  CHECK(q56.release == client_release::v0_5_6);
  const auto& k56 = std::get<lookup_req>(q56.body).key;
  CHECK(k56.token_ids == tokens_expected);
  CHECK(k56.model_name == "m");
  CHECK(k56.end == 5);
  CHECK(k56.request_id == "r");
  CHECK(k56.num_kv_readers == 1);
  CHECK_FALSE(k56.worker_id.has_value());

  pb::LookupRequest r57;
  *r57.mutable_key() = key(tokens_057, 5);
  r57.mutable_key()->set_worker_id(3);
  r57.set_tp_size(1);
  auto q57 = decoded("/lmcache.mp.LookupService/Lookup", r57, client_release::v0_5_7);
  CHECK(q57.release == client_release::v0_5_7);
  const auto& k57 = std::get<lookup_req>(q57.body).key;
  CHECK(k57.token_ids == tokens_expected);
  CHECK(k57.worker_id == 3);
}

TEST_CASE("grpc: an unlatched client's token field is told apart by its shape") {
  CHECK(guess_token_release(tokens_057) == client_release::v0_5_7);
  CHECK(guess_token_release(tokens_056) == client_release::v0_5_6);
  CHECK(guess_token_release("") == client_release::v0_5_6);
  // A multiple of 4 bytes with a word above 2^24: varints, not a token word.
  CHECK(guess_token_release(bytes({0x81, 0x01, 0x02, 0x03})) == client_release::v0_5_6);
  // Eight 0.5.6 tokens of id 0 (eight 0x00 varints) look like two words;
  // the key's end (8 tokens) says varints.
  CHECK(guess_token_release(std::string(8, '\0'), 8) == client_release::v0_5_6);
  CHECK(guess_token_release(std::string(8, '\0'), 2) == client_release::v0_5_7);
  pb::LookupRequest r;
  *r.mutable_key() = key(tokens_057, 5);
  auto q = decoded("/lmcache.mp.LookupService/Lookup", r);
  CHECK(std::get<lookup_req>(q.body).key.token_ids == tokens_expected);
}

TEST_CASE("grpc: bad fields are refused, naming the message and the field") {
  const auto* m = find_grpc_method("/lmcache.mp.LookupService/Lookup");
  REQUIRE(m);
  pb::LookupRequest r;
  // 2^33 as a varint: not a token id.
  *r.mutable_key() = key(bytes({0x80, 0x80, 0x80, 0x80, 0x20}), 1);
  auto f = grpc_request_frames(*m, r.SerializeAsString(), client_release::v0_5_6, 1);
  REQUIRE_FALSE(f);
  CHECK(f.error_value().kind == "bad_request");
  CHECK(f.error_value().detail.find("LookupRequest.key: token_ids[0]") != std::string::npos);
  // Truncated varint.
  *r.mutable_key() = key(bytes({0x01, 0x80}), 1);
  f = grpc_request_frames(*m, r.SerializeAsString(), client_release::v0_5_6, 1);
  REQUIRE_FALSE(f);
  CHECK(f.error_value().detail.find("truncated varint") != std::string::npos);
  // Not a protobuf message at all.
  f = grpc_request_frames(*m, bytes({0xff, 0xff, 0xff}), client_release::v0_5_6, 1);
  REQUIRE_FALSE(f);
  CHECK(f.error_value().detail.find("LookupRequest: not a valid protobuf message") !=
        std::string::npos);
  // request_configs that are not one msgpack value.
  *r.mutable_key() = key(tokens_056, 5);
  r.mutable_key()->set_encoded_request_configs(bytes({0x81}));
  f = grpc_request_frames(*m, r.SerializeAsString(), client_release::v0_5_6, 1);
  REQUIRE_FALSE(f);
  CHECK(f.error_value().detail.find("encoded_request_configs") != std::string::npos);
}

TEST_CASE("grpc free_lookup_locks and prepare_store carry 0.5.7's third argument") {
  pb::FreeLookupLocksRequest r;
  *r.mutable_key() = key(tokens_057, 0);
  r.set_tp_size(1);
  auto* e = r.add_extra_ranges();
  e->set_start(0);
  e->set_end(256);
  auto q = decoded("/lmcache.mp.LookupService/FreeLookupLocks", r, client_release::v0_5_7);
  const auto& b = std::get<free_lookup_locks_req>(q.body);
  REQUIRE(b.extra_ranges.size() == 1);
  CHECK(b.extra_ranges[0] == std::pair<int64_t, int64_t>{0, 256});
  CHECK(q.release == client_release::v0_5_7);
  // 0.5.6: two arguments (an empty extra_ranges is not on the wire).
  pb::FreeLookupLocksRequest r56;
  *r56.mutable_key() = key(tokens_056, 5);
  auto q56 = decoded("/lmcache.mp.LookupService/FreeLookupLocks", r56, client_release::v0_5_6);
  CHECK(q56.release == client_release::v0_5_6);
  CHECK(std::get<free_lookup_locks_req>(q56.body).extra_ranges.empty());

  pb::PrepareStoreRequest p;
  *p.mutable_key() = key(tokens_057, 5);
  p.set_instance_id(9);
  auto qp = decoded("/lmcache.mp.EngineDrivenService/PrepareStore", p, client_release::v0_5_7);
  CHECK(qp.release == client_release::v0_5_7);
  CHECK(std::get<prepare_store_req>(qp.body).instance_id == 9);
}

TEST_CASE("grpc engine-driven registration: 0.5.7's group_layouts even when empty") {
  pb::RegisterKvCacheEngineDrivenContextRequest r;
  r.set_instance_id(42);
  r.set_model_name("m");
  r.set_world_size(1);
  r.set_block_size(16);
  r.set_num_layers(2);
  r.set_hidden_dim_size(512);
  r.set_dtype_str("bfloat16");
  auto q57 = decoded("/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext", r,
                     client_release::v0_5_7);
  const auto& b57 = std::get<register_engine_driven_req>(q57.body);
  REQUIRE(b57.group_layouts.has_value());
  CHECK(b57.group_layouts->empty());
  CHECK(q57.release == client_release::v0_5_7);
  CHECK_FALSE(b57.num_physical_slots.has_value());
  auto q56 = decoded("/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext", r,
                     client_release::v0_5_6);
  CHECK_FALSE(std::get<register_engine_driven_req>(q56.body).group_layouts.has_value());
  CHECK(q56.release == client_release::v0_5_6);
}

TEST_CASE("grpc engine-driven registration: a hybrid model's groups arrive field by field") {
  pb::RegisterKvCacheEngineDrivenContextRequest r;
  r.set_instance_id(7);
  r.set_model_name("m");
  r.set_world_size(1);
  r.set_block_size(64);
  r.set_num_layers(2);
  r.set_hidden_dim_size(128);
  r.set_dtype_str("float32");
  auto* full = r.add_group_layouts();
  full->set_num_layers(2);
  full->set_hidden_dim_size(128);
  full->set_dtype_str("float32");
  full->set_tokens_per_block(64);
  full->set_window_tokens(256);
  full->set_kv_size(2);
  auto* swa = r.add_group_layouts();
  swa->set_num_layers(3);
  swa->set_hidden_dim_size(64);
  swa->set_dtype_str("bfloat16");
  swa->set_tokens_per_block(64);
  swa->set_window_tokens(128);
  swa->set_kv_size(1);
  swa->set_window_chunks(1);
  swa->set_recurrent(true);
  auto q = decoded("/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext", r,
                   client_release::v0_5_7);
  const auto& b = std::get<register_engine_driven_req>(q.body);
  REQUIRE(b.group_layouts.has_value());
  REQUIRE(b.group_layouts->size() == 2);
  const auto& g0 = (*b.group_layouts)[0];
  const auto& g1 = (*b.group_layouts)[1];
  CHECK(g0.num_layers == 2);
  CHECK(g0.window_tokens == 256);
  CHECK(g0.kv_size == 2);
  CHECK(g0.window_chunks == 0);
  CHECK_FALSE(g0.recurrent);
  CHECK(g1.num_layers == 3);
  CHECK(g1.hidden_dim_size == 64);
  CHECK(g1.dtype_str == "bfloat16");
  CHECK(g1.tokens_per_block == 64);
  CHECK(g1.window_tokens == 128);
  CHECK(g1.kv_size == 1);
  CHECK(g1.window_chunks == 1);
  CHECK(g1.recurrent);
}

TEST_CASE("grpc replies: msgpack bodies become the RPC's response messages") {
  auto m = [](std::string_view p) { return *find_grpc_method(p); };
  // store: (event_handle, ok)
  auto store = grpc_response(m("/lmcache.mp.LMCacheDrivenService/Store"),
                             encode_reply_event_ok("ev", true));
  REQUIRE(store);
  pb::StoreResponse sr;
  REQUIRE(sr.ParseFromString(*store));
  CHECK(sr.result().event_ipc_handle() == "ev");
  CHECK(sr.result().success());
  // get_chunk_size: int
  auto cs = grpc_response(m("/lmcache.mp.ManagementService/GetChunkSize"), encode_reply_int(256));
  REQUIRE(cs);
  pb::GetChunkSizeResponse c;
  REQUIRE(c.ParseFromString(*cs));
  CHECK(c.chunk_size() == 256);
  // wait_prefetch_status: int | None
  auto w = grpc_response(m("/lmcache.mp.LookupService/WaitPrefetchStatus"), encode_reply_int(4));
  REQUIRE(w);
  pb::WaitPrefetchStatusResponse wr;
  REQUIRE(wr.ParseFromString(*w));
  CHECK(wr.has_chunk_count());
  CHECK(wr.chunk_count() == 4);
  auto none = grpc_response(m("/lmcache.mp.LookupService/QueryPrefetchStatus"), std::nullopt);
  REQUIRE(none);
  CHECK(none->empty());
  // get_experimental: list[str]
  auto ge = grpc_response(m("/lmcache.mp.ControllerService/GetExperimental"),
                          encode_reply_str_list({"kv_event_stream"}));
  REQUIRE(ge);
  pb::GetExperimentalResponse g;
  REQUIRE(g.ParseFromString(*ge));
  REQUIRE(g.names_size() == 1);
  CHECK(g.names(0) == "kv_event_stream");
  // engine-driven context: a map; prepare_store's context travels as msgpack bytes.
  auto ctx = grpc_response(m("/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext"),
                           encode_reply_engine_driven_context("/kvs_x", 1 << 20, 0));
  REQUIRE(ctx);
  pb::RegisterKvCacheEngineDrivenContextResponse cr;
  REQUIRE(cr.ParseFromString(*ctx));
  CHECK(cr.shm_name() == "/kvs_x");
  CHECK(cr.pool_size() == (1 << 20));
  shm_slot_desc slot{4096, 1024, {2, 2, 16, 8}, "bfloat16"};
  auto ps = grpc_response(m("/lmcache.mp.EngineDrivenService/PrepareStore"),
                          encode_reply_prepare_store({slot}, {0}));
  REQUIRE(ps);
  pb::PrepareStoreResponse pr;
  REQUIRE(pr.ParseFromString(*ps));
  // The context is the "context" value of the ZeroMQ body, byte for byte.
  const auto zmq_body = encode_reply_prepare_store({slot}, {0});
  CHECK(zmq_body.find(pr.encoded_context()) != std::string::npos);
  CHECK(static_cast<uint8_t>(pr.encoded_context()[0]) == 0x82); // {slots, chunk_indices}
  // A body of the wrong shape is a bug, reported, not sent.
  auto bad = grpc_response(m("/lmcache.mp.LMCacheDrivenService/Store"), encode_reply_int(1));
  REQUIRE_FALSE(bad);
  CHECK(bad.error_value().kind == "bad_reply");
}

TEST_CASE("grpc: failure replies' reason, and kv event batches") {
  CHECK(grpc_failure_text(encode_mp_failure_op("negotiate_chunk_size: no")) ==
        "kvsidecar: negotiate_chunk_size: no");
  CHECK(grpc_failure_text("") == "the server refused the request");

  kv_event_record rec;
  rec.seq = 3;
  rec.model_name = "m";
  rec.block_hashes = {0x0102030405060708ULL};
  rec.parent_block_hash = 9;
  rec.token_ids = {1, 2};
  kv_event_batch_out out;
  out.enabled = true;
  out.incarnation = 11;
  out.next_cursor = 4;
  out.events = {&rec};
  auto b = grpc_kv_event_batch(encode_kv_event_batch(out));
  REQUIRE(b);
  pb::KVEventBatch batch;
  REQUIRE(batch.ParseFromString(*b));
  CHECK(batch.enabled());
  CHECK(batch.incarnation() == 11);
  CHECK(batch.next_cursor() == 4);
  REQUIRE(batch.events_size() == 1);
  const auto& e = batch.events(0);
  CHECK(e.seq() == 3);
  CHECK(e.kind() == "stored");
  CHECK(e.medium() == "CPU");
  REQUIRE(e.block_hashes_size() == 1);
  CHECK(e.block_hashes(0) == bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  CHECK(e.has_parent_block_hash());
  CHECK(e.token_ids_size() == 2);
}

TEST_CASE("grpc: every method's row makes frames the shared decoder reads as its op") {
  // Every path kvsidecar serves (the rows of grpc_methods.cpp), each with the message's
  // fields left at their defaults (an empty message; register_kv_cache needs
  // a known engine type), as a client of each release: the row exists, the
  // frames are uid · op name · arguments, and the engine bridge's decoder
  // reads them as the method's op. A method added without a row, or a row
  // whose frames the decoder would refuse, fails here.
  pb::RegisterKvCacheRequest register_msg;
  register_msg.set_engine_type("vllm");
  size_t methods = 0;
  for (const auto& method : all_grpc_methods()) {
    const auto* m = &method;
    ++methods;
    for (auto rel : {client_release::unknown, client_release::v0_5_6, client_release::v0_5_7}) {
      if (m->release != client_release::unknown && rel != client_release::unknown &&
          rel != m->release)
        continue; // a release-specific service is only called by its release
      const std::string where{m->path};
      CAPTURE(where);
      CAPTURE(static_cast<int>(rel));
      const std::string msg =
        m->op == mp_op::register_kv_cache ? register_msg.SerializeAsString() : std::string{};
      auto frames = grpc_request_frames(*m, msg, rel, 5);
      REQUIRE_MESSAGE(frames, (frames ? "" : frames.error_value().detail));
      REQUIRE(frames->size() >= 2);
      CHECK(grpc_call_id((*frames)[0]) == 5u);
      CHECK(grpc_failure_text((*frames)[1]) == std::string(op_name(*m)));
      if (m->subscribe) {
        CHECK(frames->size() == 6); // instance, model, cursor, max_events
        continue;
      }
      std::vector<std::string_view> views(frames->begin(), frames->end());
      auto req = decode_mp_request(views);
      REQUIRE_MESSAGE(req, (req ? "" : req.error_value().detail));
      CHECK(req->op == m->op);
    }
  }
  CHECK(methods == 33); // 15 shared, 8 of 0.5.6's services, 10 of 0.5.7's
}

TEST_CASE("grpc: a message of plain arguments needs no row: its fields by name, byte for byte") {
  // These go through grpc_generic.hpp (their op row's arguments read off the
  // message's fields); the frames must be what LMCache's ZeroMQ client sends.
  auto frames = [](std::string_view path, const auto& msg, client_release rel) {
    const auto* m = find_grpc_method(path);
    REQUIRE(m != nullptr);
    auto f = grpc_request_frames(*m, msg.SerializeAsString(), rel, 7);
    REQUIRE_MESSAGE(f, (f ? "" : f.error_value().detail));
    return std::vector<std::string>(f->begin() + 2, f->end()); // the arguments
  };
  const auto v57 = client_release::v0_5_7;
  pb::PingRequest ping;
  CHECK(frames("/lmcache.mp.ManagementService/Ping", ping, v57) == std::vector<std::string>{"\xc0"});
  ping.set_instance_id(5);
  CHECK(frames("/lmcache.mp.ManagementService/Ping", ping, v57) == std::vector<std::string>{"\x05"});
  pb::ClearRequest clear;
  CHECK(frames("/lmcache.mp.ManagementService/Clear", clear, v57) == std::vector<std::string>{"\xc2"});
  clear.set_force(true);
  CHECK(frames("/lmcache.mp.ManagementService/Clear", clear, v57) == std::vector<std::string>{"\xc3"});
  pb::WaitPrefetchStatusRequest wait;
  wait.set_request_id("r");
  wait.set_timeout(1.5);
  CHECK(frames("/lmcache.mp.LookupService/WaitPrefetchStatus", wait, v57) ==
        std::vector<std::string>{"\xa1r", bytes({0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0})});
  pb::NegotiateChunkSizeRequest neg;
  neg.set_required_chunk_alignment(16);
  CHECK(frames("/lmcache.mp.ManagementService/NegotiateChunkSize", neg, v57) ==
        std::vector<std::string>{"\x10"});
  pb::UnregisterKvCacheRequest unreg;
  unreg.set_instance_id(-1);
  CHECK(frames("/lmcache.mp.LMCacheDrivenService/UnregisterKvCache", unreg, v57) ==
        std::vector<std::string>{"\xff"});
  CHECK(frames("/lmcache.mp.ManagementService/GetChunkSize", pb::GetChunkSizeRequest{}, v57).empty());
  pb::CommitStoreRequest commit;
  *commit.mutable_key() = key(tokens_057, 5);
  commit.set_instance_id(9);
  commit.set_data("ab");
  auto c = frames("/lmcache.mp.EngineDrivenService/CommitStore", commit, v57);
  REQUIRE(c.size() == 3); // key, instance_id, data
  CHECK(c[1] == "\x09");
  CHECK(c[2] == bytes({0xc4, 2, 'a', 'b'}));
  // The same key frame as a row-written message's (StoreRequest's first argument).
  pb::StoreRequest store;
  *store.mutable_key() = key(tokens_057, 5);
  CHECK(frames("/lmcache.mp.LMCacheDrivenService/Store", store, v57)[0] == c[0]);

  // A scalar body goes into the response's one field.
  auto reply = [](std::string_view path, const std::optional<std::string>& body) {
    return grpc_response(*find_grpc_method(path), body);
  };
  pb::GetChunkSizeResponse cs;
  auto r1 = reply("/lmcache.mp.ManagementService/GetChunkSize", encode_reply_int(256));
  REQUIRE(r1);
  REQUIRE(cs.ParseFromString(*r1));
  CHECK(cs.chunk_size() == 256);
  pb::PingResponse pong;
  auto r2 = reply("/lmcache.mp.ControllerService/Ping", encode_reply_bool(true));
  REQUIRE(r2);
  REQUIRE(pong.ParseFromString(*r2));
  CHECK(pong.ok());
  pb::NoopResponse noop;
  auto r3 = reply("/lmcache.mp.ManagementService/Noop", encode_reply_str("OK"));
  REQUIRE(r3);
  REQUIRE(noop.ParseFromString(*r3));
  CHECK(noop.message() == "OK");
  auto r4 = reply("/lmcache.mp.EngineDrivenService/CommitRetrieve", encode_reply_bool(false));
  REQUIRE(r4);
  CHECK(r4->empty()); // success false: the default, nothing on the wire
  // int | None: nil (or None) leaves the optional field unset.
  pb::QueryPrefetchStatusResponse q;
  auto r5 = reply("/lmcache.mp.LookupService/QueryPrefetchStatus", std::string("\xc0", 1));
  REQUIRE(r5);
  REQUIRE(q.ParseFromString(*r5));
  CHECK_FALSE(q.has_chunk_count());
  auto r6 = reply("/lmcache.mp.LookupService/WaitPrefetchStatus", std::nullopt);
  REQUIRE(r6);
  CHECK(r6->empty());
  auto r7 = reply("/lmcache.mp.LookupService/QueryPrefetchStatus", encode_reply_int(0));
  REQUIRE(r7);
  REQUIRE(q.ParseFromString(*r7));
  CHECK(q.has_chunk_count()); // 0 is an answer, not None
  CHECK(q.chunk_count() == 0);
  // A field without presence needs a body; a body of the wrong kind is a bug.
  auto none = reply("/lmcache.mp.ManagementService/GetChunkSize", std::nullopt);
  REQUIRE_FALSE(none);
  CHECK(none.error_value().kind == "bad_reply");
  CHECK(none.error_value().detail == "get_chunk_size: no reply body");
  auto wrong = reply("/lmcache.mp.ManagementService/Ping", encode_reply_int(1));
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error_value().detail == "ping: ok: expected bool, got int");

  // A None-returning op's response is its empty message, whatever came.
  for (const char* path : {"/lmcache.mp.LookupService/Lookup", "/lmcache.mp.ManagementService/Clear",
                           "/lmcache.mp.LMCacheDrivenService/RegisterKvCache"}) {
    CAPTURE(path);
    auto r = grpc_response(*find_grpc_method(path), std::nullopt);
    REQUIRE(r);
    CHECK(r->empty());
  }
}
