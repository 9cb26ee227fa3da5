#include "lmcache_grpc/grpc_transcode.hpp"

#include "lmcache_wire/tensor_wrappers.hpp"
#include "msgpack/msgpack_reader.hpp"
#include "msgpack/msgpack_writer.hpp"

#include "engine_driven_service.pb.h"
#include "extension_service.pb.h"
#include "kv_event_service.pb.h"
#include "lmcache_driven_service.pb.h"
#include "lookup_service.pb.h"
#include "management_service.pb.h"

#include <google/protobuf/stubs/logging.h>

#include <cmath>

namespace kvs {

namespace pb = lmcache::mp;
using msgpack_io::writer;

namespace {

error bad(std::string_view where, std::string why) {
  return error{"bad_request", std::string(where) + ": " + std::move(why)};
}

template <class Message>
expected<Message> parse(std::string_view bytes, const char* name) {
  Message m;
  if (bytes.size() > static_cast<size_t>(INT32_MAX)
      || !m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return bad(name, "not a valid protobuf message (" + std::to_string(bytes.size()) + " bytes)");
  return m;
}

/// One frame: what `fill` writes.
template <class Fill>
std::string frame(Fill&& fill) {
  std::string out;
  writer w{out};
  fill(w);
  w.finish();
  return out;
}

/// 0.5.6's packed `repeated int64 token_ids`: varints, each a token id.
status write_token_varints(writer& w, std::string_view field, std::string_view where) {
  const auto* p = reinterpret_cast<const uint8_t*>(field.data());
  const size_t n = field.size();
  uint32_t count = 0;
  for (size_t i = 0; i < n; ++i)
    count += (p[i] & 0x80) == 0;
  if (n > 0 && (p[n - 1] & 0x80) != 0)
    return bad(where, "token_ids: truncated varint at byte " + std::to_string(n - 1));
  w.array(count);
  size_t i = 0;
  for (uint32_t k = 0; k < count; ++k) {
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
      const uint8_t b = p[i++];
      if (shift < 64)
        v |= uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if ((b & 0x80) == 0)
        break;
      if (shift >= 70)
        return bad(where, "token_ids[" + std::to_string(k) + "]: varint longer than 10 bytes");
    }
    // LMCache hashes tokens as big-endian uint32 (token_hasher.py).
    if (v > 0xffffffffULL)
      return bad(where, "token_ids[" + std::to_string(k) + "] = " +
                          std::to_string(static_cast<int64_t>(v)) + " is outside [0, 2^32)");
    w.uint(v);
  }
  return {};
}

/// IpcCacheServerKey as custom_types.py's msgspec Struct encodes it (a map
/// keyed by field name), in the release's token field.
status write_key(writer& w, const pb::IpcCacheServerKey& k, client_release rel,
                 std::string_view where) {
  w.map(10);
  w.key("model_name");
  w.str(k.model_name());
  w.key("world_size");
  w.sint(k.world_size());
  w.key("worker_id");
  if (k.has_worker_id())
    w.sint(k.worker_id());
  else
    w.nil();
  if (rel == client_release::v0_5_7) {
    w.key("token_bytes");
    w.bin(k.token_bytes());
  } else {
    w.key("token_ids");
    if (auto r = write_token_varints(w, k.token_bytes(), where); !r)
      return r;
  }
  w.key("start");
  w.sint(k.start());
  w.key("end");
  w.sint(k.end());
  w.key("request_id");
  w.str(k.request_id());
  w.key("cache_salt");
  w.str(k.cache_salt());
  w.key("request_configs");
  // dict | None travels as msgpack bytes (proto_codec.py _encode_mapping).
  const auto& rc = k.encoded_request_configs();
  if (!k.has_encoded_request_configs() || rc.empty()) {
    w.nil();
  } else {
    msgpack_io::reader r{reinterpret_cast<const uint8_t*>(rc.data()), rc.size()};
    if (!r.skip(1) || r.remaining() != 0)
      return bad(where, "encoded_request_configs: not one msgpack value");
    w.raw(rc.data(), rc.size());
  }
  w.key("num_kv_readers");
  w.sint(k.num_kv_readers());
  return {};
}

expected<std::string> key_frame(const pb::IpcCacheServerKey& k, client_release rel,
                                std::string_view where) {
  std::string out;
  writer w{out};
  if (auto r = write_key(w, k, rel, where); !r)
    return r.error_value();
  w.finish();
  return out;
}

std::string int_frame(int64_t v) {
  return frame([&](writer& w) { w.sint(v); });
}
std::string str_frame(std::string_view v) {
  return frame([&](writer& w) { w.str(v); });
}
std::string bin_frame(std::string_view v) {
  return frame([&](writer& w) { w.bin(v); });
}

template <class Groups>
std::string block_groups_frame(const Groups& groups) {
  return frame([&](writer& w) {
    w.array(static_cast<uint32_t>(groups.size()));
    for (const auto& g : groups) {
      w.array(static_cast<uint32_t>(g.block_ids_size()));
      for (auto b : g.block_ids())
        w.sint(b);
    }
  });
}

/// A dict field that travels as msgpack bytes: empty bytes are {} (LMCache).
expected<std::string> mapping_frame(const std::string& bytes, std::string_view where) {
  if (bytes.empty())
    return frame([](writer& w) { w.map(0); });
  msgpack_io::reader r{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  msgpack_io::item it;
  if (!r.next(it) || it.kind != msgpack_io::value_type::map)
    return bad(where, "not a msgpack map");
  r.seek(0);
  if (!r.skip(1) || r.remaining() != 0)
    return bad(where, "not one msgpack value");
  return bytes;
}

/// Chooses the release for a shared-service request of an unlatched client.
client_release key_release(client_release dialect, const pb::IpcCacheServerKey& k) {
  return dialect != client_release::unknown ? dialect
                                            : guess_token_release(k.token_bytes(), k.end());
}

using frames_t = std::vector<std::string>;

/// free_lookup_locks / prepare_store: (key, int) in 0.5.6; 0.5.7 always adds
/// a third argument, a list (proto3 drops it when empty, so its presence
/// shows 0.5.7 only when it has entries; the latch decides otherwise).
template <class Message, class Items, class WriteItem>
expected<frames_t> with_057_argument(const Message& r, const std::string& name, const char* field,
                                     int64_t second, const Items& items, client_release dialect,
                                     WriteItem&& write_item) {
  auto d = items.size() > 0 && dialect == client_release::unknown ? client_release::v0_5_7
                                                                  : dialect;
  auto rel = key_release(d, r.key());
  auto k = key_frame(r.key(), rel, name + ".key");
  if (!k)
    return k.error_value();
  frames_t a;
  a.push_back(std::move(*k));
  a.push_back(int_frame(second));
  if (rel != client_release::v0_5_7) {
    if (items.size() > 0)
      return bad(name + "." + field, "0.5.7's field from a client that showed 0.5.6");
    return a;
  }
  a.push_back(frame([&](writer& w) {
    w.array(static_cast<uint32_t>(items.size()));
    for (const auto& item : items)
      write_item(w, item);
  }));
  return a;
}

/// The argument frames of `m` (after uid and op).
expected<frames_t> args_of(const grpc_method& m, std::string_view bytes, client_release dialect) {
  frames_t a;
  // The key frame first, in the release the client showed (or its shape says).
  auto keyed = [&](const auto& msg, const char* name) -> status {
    auto k = key_frame(msg.key(), key_release(dialect, msg.key()), std::string(name) + ".key");
    if (!k)
      return k.error_value();
    a.push_back(std::move(*k));
    return {};
  };
  if (m.subscribe) {
    auto r = parse<pb::SubscribeKvEventsRequest>(bytes, "SubscribeKvEventsRequest");
    if (!r)
      return r.error_value();
    a = {int_frame(r->instance_id()), str_frame(r->model_name()), int_frame(r->cursor()),
         int_frame(r->max_events())};
    return a;
  }
  switch (m.op) {
    case mp_op::register_kv_cache: {
      auto r = parse<pb::RegisterKvCacheRequest>(bytes, "RegisterKvCacheRequest");
      if (!r)
        return r.error_value();
      auto hints = mapping_frame(r->encoded_layout_hints(), "RegisterKvCacheRequest.encoded_layout_hints");
      if (!hints)
        return hints.error_value();
      a.push_back(int_frame(r->instance_id()));
      a.push_back(frame([&](writer& w) {
        // DeviceIPCWrapper.Serialize bytes: the payload of ext 1 on ZeroMQ.
        w.array(static_cast<uint32_t>(r->kv_cache_size()));
        for (const auto& t : r->kv_cache())
          w.ext(lmcache_ipc_wrapper_ext, t.descriptor_payload());
      }));
      a.push_back(str_frame(r->model_name()));
      a.push_back(int_frame(r->world_size()));
      a.push_back(str_frame(r->engine_type()));
      a.push_back(std::move(*hints));
      a.push_back(frame([&](writer& w) {
        w.array(static_cast<uint32_t>(r->engine_group_infos_size()));
        for (const auto& g : r->engine_group_infos()) {
          w.map(6);
          w.key("engine_group_id");
          w.sint(g.engine_group_id());
          w.key("layer_indices");
          w.array(static_cast<uint32_t>(g.layer_indices_size()));
          for (auto l : g.layer_indices())
            w.sint(l);
          w.key("tokens_per_block");
          w.sint(g.tokens_per_block());
          w.key("sw_size_tokens");
          w.sint(g.sw_size_tokens());
          w.key("extra_object_group_tag");
          w.sint(g.extra_object_group_tag());
          w.key("recurrent_state");
          w.boolean(g.recurrent_state());
        }
      }));
      return a;
    }
    case mp_op::unregister_kv_cache: {
      auto r = parse<pb::UnregisterKvCacheRequest>(bytes, "UnregisterKvCacheRequest");
      if (!r)
        return r.error_value();
      a.push_back(int_frame(r->instance_id()));
      return a;
    }
    case mp_op::store: {
      auto r = parse<pb::StoreRequest>(bytes, "StoreRequest");
      if (!r)
        return r.error_value();
      if (auto k = keyed(*r, "StoreRequest"); !k)
        return k.error_value();
      a.push_back(int_frame(r->instance_id()));
      a.push_back(block_groups_frame(r->gpu_block_ids()));
      a.push_back(bin_frame(r->event_ipc_handle()));
      return a;
    }
    case mp_op::retrieve: {
      auto r = parse<pb::RetrieveRequest>(bytes, "RetrieveRequest");
      if (!r)
        return r.error_value();
      if (auto k = keyed(*r, "RetrieveRequest"); !k)
        return k.error_value();
      a.push_back(int_frame(r->instance_id()));
      a.push_back(block_groups_frame(r->gpu_block_ids()));
      a.push_back(bin_frame(r->event_ipc_handle()));
      a.push_back(int_frame(r->skip_first_n_tokens()));
      return a;
    }
    case mp_op::lookup: {
      auto r = parse<pb::LookupRequest>(bytes, "LookupRequest");
      if (!r)
        return r.error_value();
      if (auto k = keyed(*r, "LookupRequest"); !k)
        return k.error_value();
      a.push_back(int_frame(r->tp_size()));
      return a;
    }
    case mp_op::query_prefetch_status: {
      auto r = parse<pb::QueryPrefetchStatusRequest>(bytes, "QueryPrefetchStatusRequest");
      if (!r)
        return r.error_value();
      a.push_back(str_frame(r->request_id()));
      return a;
    }
    case mp_op::wait_prefetch_status: {
      auto r = parse<pb::WaitPrefetchStatusRequest>(bytes, "WaitPrefetchStatusRequest");
      if (!r)
        return r.error_value();
      a.push_back(str_frame(r->request_id()));
      a.push_back(frame([&](writer& w) { w.float64(r->timeout()); }));
      return a;
    }
    case mp_op::free_lookup_locks: {
      auto r = parse<pb::FreeLookupLocksRequest>(bytes, "FreeLookupLocksRequest");
      if (!r)
        return r.error_value();
      return with_057_argument(*r, "FreeLookupLocksRequest", "extra_ranges", r->tp_size(),
                               r->extra_ranges(), dialect, [](writer& w, const auto& e) {
                                 w.array(2);
                                 w.sint(e.start());
                                 w.sint(e.end());
                               });
    }
    case mp_op::end_session: {
      auto r = parse<pb::EndSessionRequest>(bytes, "EndSessionRequest");
      if (!r)
        return r.error_value();
      a.push_back(str_frame(r->request_id()));
      return a;
    }
    case mp_op::register_kv_cache_engine_driven_context: {
      auto r = parse<pb::RegisterKvCacheEngineDrivenContextRequest>(
        bytes, "RegisterKvCacheEngineDrivenContextRequest");
      if (!r)
        return r.error_value();
      // proto3 drops an empty group_layouts: the latched release decides.
      const bool v57 = dialect == client_release::v0_5_7 || r->group_layouts_size() > 0;
      a.push_back(frame([&](writer& w) {
        w.map(v57 ? 10 : 9);
        w.key("instance_id");
        w.sint(r->instance_id());
        w.key("model_name");
        w.str(r->model_name());
        w.key("world_size");
        w.sint(r->world_size());
        w.key("block_size");
        w.sint(r->block_size());
        w.key("num_layers");
        w.sint(r->num_layers());
        w.key("hidden_dim_size");
        w.sint(r->hidden_dim_size());
        w.key("dtype_str");
        w.str(r->dtype_str());
        w.key("use_mla");
        w.boolean(r->use_mla());
        w.key("num_physical_slots");
        if (r->has_num_physical_slots())
          w.sint(r->num_physical_slots());
        else
          w.nil();
        if (v57) {
          w.key("group_layouts");
          w.array(static_cast<uint32_t>(r->group_layouts_size()));
          for (const auto& g : r->group_layouts()) {
            w.map(8);
            w.key("num_layers");
            w.sint(g.num_layers());
            w.key("hidden_dim_size");
            w.sint(g.hidden_dim_size());
            w.key("dtype_str");
            w.str(g.dtype_str());
            w.key("tokens_per_block");
            w.sint(g.tokens_per_block());
            w.key("window_tokens");
            w.sint(g.window_tokens());
            w.key("kv_size");
            w.sint(g.kv_size());
            w.key("window_chunks");
            w.sint(g.window_chunks());
            w.key("recurrent");
            w.boolean(g.recurrent());
          }
        }
      }));
      return a;
    }
    case mp_op::unregister_kv_cache_engine_driven_context: {
      auto r = parse<pb::UnregisterKvCacheEngineDrivenContextRequest>(
        bytes, "UnregisterKvCacheEngineDrivenContextRequest");
      if (!r)
        return r.error_value();
      a.push_back(int_frame(r->instance_id()));
      return a;
    }
    case mp_op::prepare_store: {
      auto r = parse<pb::PrepareStoreRequest>(bytes, "PrepareStoreRequest");
      if (!r)
        return r.error_value();
      return with_057_argument(*r, "PrepareStoreRequest", "skipped_chunks", r->instance_id(),
                               r->skipped_chunks(), dialect, [](writer& w, const auto& g) {
                                 w.array(static_cast<uint32_t>(g.indices_size()));
                                 for (auto i : g.indices())
                                   w.sint(i);
                               });
    }
    case mp_op::commit_store: {
      auto r = parse<pb::CommitStoreRequest>(bytes, "CommitStoreRequest");
      if (!r)
        return r.error_value();
      if (auto k = keyed(*r, "CommitStoreRequest"); !k)
        return k.error_value();
      a.push_back(int_frame(r->instance_id()));
      a.push_back(bin_frame(r->data()));
      return a;
    }
    case mp_op::prepare_retrieve: {
      auto r = parse<pb::PrepareRetrieveRequest>(bytes, "PrepareRetrieveRequest");
      if (!r)
        return r.error_value();
      if (auto k = keyed(*r, "PrepareRetrieveRequest"); !k)
        return k.error_value();
      a.push_back(int_frame(r->instance_id()));
      return a;
    }
    case mp_op::commit_retrieve: {
      auto r = parse<pb::CommitRetrieveRequest>(bytes, "CommitRetrieveRequest");
      if (!r)
        return r.error_value();
      if (auto k = keyed(*r, "CommitRetrieveRequest"); !k)
        return k.error_value();
      a.push_back(int_frame(r->instance_id()));
      return a;
    }
    case mp_op::clear: {
      auto r = parse<pb::ClearRequest>(bytes, "ClearRequest");
      if (!r)
        return r.error_value();
      a.push_back(frame([&](writer& w) { w.boolean(r->has_force() && r->force()); }));
      return a;
    }
    case mp_op::get_chunk_size: {
      if (auto r = parse<pb::GetChunkSizeRequest>(bytes, "GetChunkSizeRequest"); !r)
        return r.error_value();
      return a;
    }
    case mp_op::negotiate_chunk_size: {
      auto r = parse<pb::NegotiateChunkSizeRequest>(bytes, "NegotiateChunkSizeRequest");
      if (!r)
        return r.error_value();
      a.push_back(int_frame(r->required_chunk_alignment()));
      return a;
    }
    case mp_op::get_experimental: {
      if (auto r = parse<pb::GetExperimentalRequest>(bytes, "GetExperimentalRequest"); !r)
        return r.error_value();
      return a;
    }
    case mp_op::noop: {
      if (auto r = parse<pb::NoopRequest>(bytes, "NoopRequest"); !r)
        return r.error_value();
      return a;
    }
    case mp_op::ping: {
      auto r = parse<pb::PingRequest>(bytes, "PingRequest");
      if (!r)
        return r.error_value();
      a.push_back(frame([&](writer& w) {
        if (r->has_instance_id())
          w.sint(r->instance_id());
        else
          w.nil();
      }));
      return a;
    }
    case mp_op::report_block_allocation: {
      auto r = parse<pb::ReportBlockAllocationRequest>(bytes, "ReportBlockAllocationRequest");
      if (!r)
        return r.error_value();
      a.push_back(int_frame(r->instance_id()));
      a.push_back(str_frame(r->model_name()));
      a.push_back(frame([&](writer& w) {
        w.array(static_cast<uint32_t>(r->records_size()));
        for (const auto& rec : r->records()) {
          w.map(3);
          w.key("req_id");
          w.str(rec.req_id());
          w.key("new_block_ids");
          w.array(static_cast<uint32_t>(rec.new_block_ids_size()));
          for (auto b : rec.new_block_ids())
            w.sint(b);
          w.key("new_token_ids");
          w.array(static_cast<uint32_t>(rec.new_token_ids_size()));
          for (auto t : rec.new_token_ids())
            w.sint(t);
        }
      }));
      return a;
    }
    case mp_op::server_module_call:
    case mp_op::server_module_affinity_call: {
      auto r = parse<pb::ServerModuleCallRequest>(bytes, "ServerModuleCallRequest");
      if (!r)
        return r.error_value();
      a.push_back(frame([&](writer& w) {
        w.map(2);
        w.key("method");
        w.str(r->method());
        w.key("payload");
        w.bin(r->payload());
      }));
      return a;
    }
    case mp_op::query_prefetch_lookup_hits:
      break;
  }
  return bad(op_name(m), "no request transcoder");
}

// -- replies --------------------------------------------------------------------

using msgpack_io::item;
using msgpack_io::value_type;

/// A cursor over one reply body.
struct body_reader {
  msgpack_io::reader r;
  std::string_view what;
  explicit body_reader(std::string_view body, std::string_view w)
    : r(reinterpret_cast<const uint8_t*>(body.data()), body.size()), what(w) {}

  error fail(std::string why) const { return error{"bad_reply", std::string(what) + ": " + why}; }
  expected<item> next() {
    item it;
    if (!r.next(it))
      return fail(r.error());
    return it;
  }
  expected<item> next(value_type want, const char* field) {
    auto it = next();
    if (!it)
      return it;
    if (it->kind != want && !(want == value_type::uint && it->kind == value_type::sint))
      return fail(std::string(field) + ": expected " + msgpack_io::kind_name(want) + ", got " +
                  msgpack_io::kind_name(it->kind));
    return it;
  }
  static int64_t as_int(const item& it) {
    return it.kind == value_type::sint ? it.i : static_cast<int64_t>(it.u);
  }
  static std::string_view as_view(const item& it) {
    return {reinterpret_cast<const char*>(it.ptr), it.len};
  }
  /// The raw bytes of the next value (for fields that travel as msgpack bytes).
  expected<std::string_view> raw_value(const char* field) {
    const size_t from = r.offset();
    if (!r.skip(1))
      return fail(std::string(field) + ": " + r.error());
    return std::string_view{reinterpret_cast<const char*>(r.at(from)), r.offset() - from};
  }
};

template <class Message>
std::string serialized(const Message& m) {
  return m.SerializeAsString();
}

/// Walks a msgpack map body, calling field(name) for each key; `field`
/// reads the value (or returns false to have it skipped).
template <class Field>
status each_field(body_reader& b, Field&& field) {
  auto head = b.next(value_type::map, "body");
  if (!head)
    return head.error_value();
  for (uint32_t i = 0; i < head->len; ++i) {
    auto k = b.next(value_type::str, "key");
    if (!k)
      return k.error_value();
    auto handled = field(body_reader::as_view(*k));
    if (!handled)
      return handled.error_value();
    if (!*handled && !b.r.skip(1))
      return b.fail(b.r.error());
  }
  return {};
}

expected<std::string> reply_of(const grpc_method& m, const std::optional<std::string>& body) {
  const std::string_view what = op_name(m);
  body_reader b{body ? std::string_view{*body} : std::string_view{}, what};
  auto need_body = [&]() -> status {
    if (!body)
      return b.fail("no reply body");
    return {};
  };
  auto int_reply = [&]() -> expected<int64_t> {
    if (auto s = need_body(); !s)
      return s.error_value();
    auto it = b.next(value_type::uint, "value");
    if (!it)
      return it.error_value();
    return body_reader::as_int(*it);
  };
  auto bool_reply = [&]() -> expected<bool> {
    if (auto s = need_body(); !s)
      return s.error_value();
    auto it = b.next(value_type::boolean, "value");
    if (!it)
      return it.error_value();
    return it->u != 0;
  };
  // (event_handle: bytes, ok: bool)
  auto event_result = [&](pb::EventIpcHandleResult* out) -> status {
    if (auto s = need_body(); !s)
      return s;
    auto head = b.next(value_type::array, "tuple");
    if (!head)
      return head.error_value();
    if (head->len != 2)
      return b.fail("expected a 2-tuple");
    auto h = b.next(value_type::bin, "event_ipc_handle");
    if (!h)
      return h.error_value();
    out->set_event_ipc_handle(std::string{body_reader::as_view(*h)});
    auto ok = b.next(value_type::boolean, "success");
    if (!ok)
      return ok.error_value();
    out->set_success(ok->u != 0);
    return {};
  };
  // None-returning ops: the empty message, whatever (nothing) came.
  switch (m.op) {
    case mp_op::register_kv_cache:
    case mp_op::unregister_kv_cache:
    case mp_op::lookup:
    case mp_op::free_lookup_locks:
    case mp_op::end_session:
    case mp_op::unregister_kv_cache_engine_driven_context:
    case mp_op::clear:
    case mp_op::report_block_allocation:
      return std::string{};
    case mp_op::store: {
      pb::StoreResponse out;
      if (auto s = event_result(out.mutable_result()); !s)
        return s.error_value();
      return serialized(out);
    }
    case mp_op::retrieve: {
      pb::RetrieveResponse out;
      if (auto s = event_result(out.mutable_result()); !s)
        return s.error_value();
      return serialized(out);
    }
    case mp_op::query_prefetch_status:
    case mp_op::wait_prefetch_status: {
      // int | None: the optional field set or not.
      pb::QueryPrefetchStatusResponse out; // same fields as WaitPrefetchStatusResponse
      if (body) {
        auto it = b.next();
        if (!it)
          return it.error_value();
        if (it->kind == value_type::uint || it->kind == value_type::sint)
          out.set_chunk_count(body_reader::as_int(*it));
        else if (it->kind != value_type::nil)
          return b.fail("chunk_count: expected int or nil");
      }
      return serialized(out);
    }
    case mp_op::get_chunk_size: {
      auto v = int_reply();
      if (!v)
        return v.error_value();
      pb::GetChunkSizeResponse out;
      out.set_chunk_size(*v);
      return serialized(out);
    }
    case mp_op::negotiate_chunk_size: {
      auto v = int_reply();
      if (!v)
        return v.error_value();
      pb::NegotiateChunkSizeResponse out;
      out.set_chunk_size(*v);
      return serialized(out);
    }
    case mp_op::ping: {
      auto v = bool_reply();
      if (!v)
        return v.error_value();
      pb::PingResponse out;
      out.set_ok(*v);
      return serialized(out);
    }
    case mp_op::commit_store:
    case mp_op::commit_retrieve: {
      auto v = bool_reply();
      if (!v)
        return v.error_value();
      pb::CommitStoreResponse out; // same field as CommitRetrieveResponse
      out.set_success(*v);
      return serialized(out);
    }
    case mp_op::noop: {
      if (auto s = need_body(); !s)
        return s.error_value();
      auto it = b.next(value_type::str, "message");
      if (!it)
        return it.error_value();
      pb::NoopResponse out;
      out.set_message(std::string{body_reader::as_view(*it)});
      return serialized(out);
    }
    case mp_op::get_experimental: {
      if (auto s = need_body(); !s)
        return s.error_value();
      auto head = b.next(value_type::array, "names");
      if (!head)
        return head.error_value();
      pb::GetExperimentalResponse out;
      for (uint32_t i = 0; i < head->len; ++i) {
        auto it = b.next(value_type::str, "names[]");
        if (!it)
          return it.error_value();
        out.add_names(std::string{body_reader::as_view(*it)});
      }
      return serialized(out);
    }
    case mp_op::register_kv_cache_engine_driven_context: {
      if (auto s = need_body(); !s)
        return s.error_value();
      pb::RegisterKvCacheEngineDrivenContextResponse out;
      auto s = each_field(b, [&](std::string_view f) -> expected<bool> {
        if (f == "shm_name") {
          auto it = b.next(value_type::str, "shm_name");
          if (!it)
            return it.error_value();
          out.set_shm_name(std::string{body_reader::as_view(*it)});
          return true;
        }
        if (f == "pool_size" || f == "null_block_id") {
          auto it = b.next(value_type::uint, "pool_size");
          if (!it)
            return it.error_value();
          if (f == "pool_size")
            out.set_pool_size(body_reader::as_int(*it));
          else
            out.set_null_block_id(body_reader::as_int(*it));
          return true;
        }
        return false;
      });
      if (!s)
        return s.error_value();
      return serialized(out);
    }
    case mp_op::prepare_store: {
      if (auto s = need_body(); !s)
        return s.error_value();
      pb::PrepareStoreResponse out;
      auto s = each_field(b, [&](std::string_view f) -> expected<bool> {
        if (f != "context")
          return false;
        auto raw = b.raw_value("context");
        if (!raw)
          return raw.error_value();
        out.set_encoded_context(std::string{*raw});
        return true;
      });
      if (!s)
        return s.error_value();
      return serialized(out);
    }
    case mp_op::prepare_retrieve: {
      if (auto s = need_body(); !s)
        return s.error_value();
      pb::PrepareRetrieveResponse out;
      auto s = each_field(b, [&](std::string_view f) -> expected<bool> {
        if (f == "success") {
          auto it = b.next(value_type::boolean, "success");
          if (!it)
            return it.error_value();
          out.set_success(it->u != 0);
          return true;
        }
        if (f == "data") {
          auto it = b.next(value_type::bin, "data");
          if (!it)
            return it.error_value();
          out.set_data(std::string{body_reader::as_view(*it)});
          return true;
        }
        if (f == "context") {
          auto raw = b.raw_value("context");
          if (!raw)
            return raw.error_value();
          out.set_encoded_context(std::string{*raw});
          return true;
        }
        return false;
      });
      if (!s)
        return s.error_value();
      return serialized(out);
    }
    case mp_op::server_module_call:
    case mp_op::server_module_affinity_call: {
      if (auto s = need_body(); !s)
        return s.error_value();
      pb::ServerModuleCallResponse out;
      auto s = each_field(b, [&](std::string_view f) -> expected<bool> {
        if (f == "success") {
          auto it = b.next(value_type::boolean, "success");
          if (!it)
            return it.error_value();
          out.set_success(it->u != 0);
          return true;
        }
        if (f == "payload" || f == "error") {
          auto it = b.next();
          if (!it)
            return it.error_value();
          if (it->kind != value_type::bin && it->kind != value_type::str)
            return b.fail(std::string(f) + ": expected bytes or str");
          if (f == "payload")
            out.set_payload(std::string{body_reader::as_view(*it)});
          else
            out.set_error(std::string{body_reader::as_view(*it)});
          return true;
        }
        return false;
      });
      if (!s)
        return s.error_value();
      return serialized(out);
    }
    case mp_op::query_prefetch_lookup_hits:
      break;
  }
  return b.fail("no reply transcoder");
}

} // namespace

expected<std::vector<std::string>> grpc_request_frames(const grpc_method& m,
                                                      std::string_view bytes,
                                                      client_release dialect, uint64_t call_id) {
  auto a = args_of(m, bytes, dialect);
  if (!a)
    return a.error_value();
  std::vector<std::string> out;
  out.reserve(a->size() + 2);
  out.push_back(frame([&](writer& w) { w.uint(call_id); }));
  out.push_back(str_frame(op_name(m)));
  for (auto& f : *a)
    out.push_back(std::move(f));
  return out;
}

expected<std::string> grpc_response(const grpc_method& m, const std::optional<std::string>& body) {
  return reply_of(m, body);
}

expected<std::string> grpc_kv_event_batch(std::string_view body) {
  body_reader b{body, "kv event batch"};
  pb::KVEventBatch out;
  auto s = each_field(b, [&](std::string_view f) -> expected<bool> {
    if (f == "enabled" || f == "lost") {
      auto it = b.next(value_type::boolean, "enabled");
      if (!it)
        return it.error_value();
      if (f == "enabled")
        out.set_enabled(it->u != 0);
      else
        out.set_lost(it->u != 0);
      return true;
    }
    if (f == "incarnation" || f == "next_cursor") {
      auto it = b.next(value_type::uint, "incarnation");
      if (!it)
        return it.error_value();
      if (f == "incarnation")
        out.set_incarnation(body_reader::as_int(*it));
      else
        out.set_next_cursor(body_reader::as_int(*it));
      return true;
    }
    if (f != "events")
      return false;
    auto n = b.next(value_type::array, "events");
    if (!n)
      return n.error_value();
    for (uint32_t i = 0; i < n->len; ++i) {
      auto* ev = out.add_events();
      auto e = each_field(b, [&](std::string_view g) -> expected<bool> {
        if (g == "seq") {
          auto it = b.next(value_type::uint, "seq");
          if (!it)
            return it.error_value();
          ev->set_seq(body_reader::as_int(*it));
          return true;
        }
        if (g == "kind" || g == "medium" || g == "model_name") {
          auto it = b.next(value_type::str, "kind");
          if (!it)
            return it.error_value();
          std::string v{body_reader::as_view(*it)};
          if (g == "kind")
            ev->set_kind(std::move(v));
          else if (g == "medium")
            ev->set_medium(std::move(v));
          else
            ev->set_model_name(std::move(v));
          return true;
        }
        if (g == "block_hashes") {
          auto h = b.next(value_type::array, "block_hashes");
          if (!h)
            return h.error_value();
          for (uint32_t k = 0; k < h->len; ++k) {
            auto it = b.next(value_type::bin, "block_hashes[]");
            if (!it)
              return it.error_value();
            ev->add_block_hashes(std::string{body_reader::as_view(*it)});
          }
          return true;
        }
        if (g == "parent_block_hash") {
          auto it = b.next();
          if (!it)
            return it.error_value();
          if (it->kind == value_type::bin)
            ev->set_parent_block_hash(std::string{body_reader::as_view(*it)});
          else if (it->kind != value_type::nil)
            return b.fail("parent_block_hash: expected bin or nil");
          return true;
        }
        if (g == "token_ids") {
          auto t = b.next(value_type::array, "token_ids");
          if (!t)
            return t.error_value();
          for (uint32_t k = 0; k < t->len; ++k) {
            auto it = b.next(value_type::uint, "token_ids[]");
            if (!it)
              return it.error_value();
            ev->add_token_ids(body_reader::as_int(*it));
          }
          return true;
        }
        return false;
      });
      if (!e)
        return e.error_value();
    }
    return true;
  });
  if (!s)
    return s.error_value();
  return out.SerializeAsString();
}

namespace {
void drop_protobuf_log(google::protobuf::LogLevel, const char*, int, const std::string&) {}
} // namespace

void silence_protobuf_log() {
  google::protobuf::SetLogHandler(&drop_protobuf_log);
}

std::optional<uint64_t> grpc_call_id(std::string_view uid_frame) {
  msgpack_io::reader r{reinterpret_cast<const uint8_t*>(uid_frame.data()), uid_frame.size()};
  item it;
  if (!r.next(it) || it.kind != value_type::uint || r.remaining() != 0)
    return std::nullopt;
  return it.u;
}

std::string grpc_failure_text(std::string_view op_frame) {
  msgpack_io::reader r{reinterpret_cast<const uint8_t*>(op_frame.data()), op_frame.size()};
  item it;
  if (r.next(it) && it.kind == value_type::str)
    return std::string{reinterpret_cast<const char*>(it.ptr), it.len};
  return "the server refused the request";
}

client_release guess_token_release(std::string_view token_field, int64_t end) {
  const auto* p = reinterpret_cast<const uint8_t*>(token_field.data());
  const size_t n = token_field.size();
  if (n == 0 || n % 4 != 0)
    return client_release::v0_5_6;
  for (size_t i = 0; i < n; i += 4)
    if (p[i] != 0)
      return client_release::v0_5_6;
  // Words too few for the key's range: varints (e.g. token 0 repeated).
  if (end > 0 && n / 4 < static_cast<uint64_t>(end)) {
    size_t varints = 0;
    for (size_t i = 0; i < n; ++i)
      varints += (p[i] & 0x80) == 0;
    if (varints >= static_cast<uint64_t>(end))
      return client_release::v0_5_6;
  }
  return client_release::v0_5_7;
}

} // namespace kvs
