#include "lmcache_grpc/grpc_reply.hpp"

#include "lmcache_grpc/grpc_body_reader.hpp"

#include "engine_driven_service.pb.h"
#include "extension_service.pb.h"
#include "lmcache_driven_service.pb.h"
#include "lookup_service.pb.h"
#include "management_service.pb.h"

namespace kvs {

namespace pb = lmcache::mp;
using grpc_reply::body_reader;
using grpc_reply::each_field;
using msgpack_io::item;
using msgpack_io::value_type;

namespace {

std::string text(const item& it) {
  return std::string{body_reader::as_view(it)};
}

template <class Message>
std::string serialized(const Message& m) {
  return m.SerializeAsString();
}

/// The response `fill` makes of one value read off the body, or why the
/// value could not be read.
template <class Message, class Value, class Fill>
expected<std::string> response_of(expected<Value> v, Fill&& fill) {
  if (!v)
    return v.error_value();
  Message out;
  fill(out, *v);
  return serialized(out);
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
  auto event_result = [&]() -> expected<pb::EventIpcHandleResult> {
    pb::EventIpcHandleResult out;
    if (auto s = need_body(); !s)
      return s.error_value();
    auto head = b.next(value_type::array, "tuple");
    if (!head)
      return head.error_value();
    if (head->len != 2)
      return b.fail("expected a 2-tuple");
    auto h = b.next(value_type::bin, "event_ipc_handle");
    if (!h)
      return h.error_value();
    out.set_event_ipc_handle(text(*h));
    auto ok = b.next(value_type::boolean, "success");
    if (!ok)
      return ok.error_value();
    out.set_success(ok->u != 0);
    return out;
  };
  // A map body: `field(out, name)` reads the value of each field the
  // response has (false: the value is skipped).
  auto map_response = [&](auto out, auto&& field) -> expected<std::string> {
    if (auto s = need_body(); !s)
      return s.error_value();
    auto s = each_field(b, [&](std::string_view f) { return field(out, f); });
    if (!s)
      return s.error_value();
    return serialized(out);
  };
  // Fields more than one map body has.
  auto success = [&](auto& out) {
    return b.field(value_type::boolean, "success",
                   [&](const item& it) { out.set_success(it.u != 0); });
  };
  auto context = [&](auto& out) -> expected<bool> {
    auto raw = b.raw_value("context");
    if (!raw)
      return raw.error_value();
    out.set_encoded_context(std::string{*raw});
    return true;
  };
  auto set_result = [](auto& out, const pb::EventIpcHandleResult& r) { *out.mutable_result() = r; };
  auto set_chunk_size = [](auto& out, int64_t v) { out.set_chunk_size(v); };
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
    case mp_op::store:
      return response_of<pb::StoreResponse>(event_result(), set_result);
    case mp_op::retrieve:
      return response_of<pb::RetrieveResponse>(event_result(), set_result);
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
    case mp_op::get_chunk_size:
      return response_of<pb::GetChunkSizeResponse>(int_reply(), set_chunk_size);
    case mp_op::negotiate_chunk_size:
      return response_of<pb::NegotiateChunkSizeResponse>(int_reply(), set_chunk_size);
    case mp_op::ping:
      return response_of<pb::PingResponse>(bool_reply(), [](auto& out, bool v) { out.set_ok(v); });
    case mp_op::commit_store:
    case mp_op::commit_retrieve: // CommitRetrieveResponse: the same field
      return response_of<pb::CommitStoreResponse>(bool_reply(),
                                                  [](auto& out, bool v) { out.set_success(v); });
    case mp_op::noop: {
      if (auto s = need_body(); !s)
        return s.error_value();
      auto it = b.next(value_type::str, "message");
      if (!it)
        return it.error_value();
      pb::NoopResponse out;
      out.set_message(text(*it));
      return serialized(out);
    }
    case mp_op::get_experimental: {
      if (auto s = need_body(); !s)
        return s.error_value();
      pb::GetExperimentalResponse out;
      auto names = b.array_of("names", value_type::str, "names[]",
                              [&](const item& it) { out.add_names(text(it)); });
      if (!names)
        return names.error_value();
      return serialized(out);
    }
    case mp_op::register_kv_cache_engine_driven_context: {
      return map_response(pb::RegisterKvCacheEngineDrivenContextResponse{},
                          [&](auto& out, std::string_view f) -> expected<bool> {
        if (f == "shm_name")
          return b.field(value_type::str, "shm_name",
                         [&](const item& it) { out.set_shm_name(text(it)); });
        if (f == "pool_size")
          return b.field(value_type::uint, "pool_size",
                         [&](const item& it) { out.set_pool_size(body_reader::as_int(it)); });
        if (f == "null_block_id") // named pool_size in its error, as before
          return b.field(value_type::uint, "pool_size",
                         [&](const item& it) { out.set_null_block_id(body_reader::as_int(it)); });
        return false;
      });
    }
    case mp_op::prepare_store: {
      return map_response(pb::PrepareStoreResponse{},
                          [&](auto& out, std::string_view f) -> expected<bool> {
        if (f != "context")
          return false;
        return context(out);
      });
    }
    case mp_op::prepare_retrieve: {
      return map_response(pb::PrepareRetrieveResponse{},
                          [&](auto& out, std::string_view f) -> expected<bool> {
        if (f == "success")
          return success(out);
        if (f == "data")
          return b.field(value_type::bin, "data", [&](const item& it) { out.set_data(text(it)); });
        if (f == "context")
          return context(out);
        return false;
      });
    }
    case mp_op::server_module_call:
    case mp_op::server_module_affinity_call: {
      return map_response(pb::ServerModuleCallResponse{},
                          [&](auto& out, std::string_view f) -> expected<bool> {
        if (f == "success")
          return success(out);
        if (f == "payload" || f == "error") {
          auto it = b.next();
          if (!it)
            return it.error_value();
          if (it->kind != value_type::bin && it->kind != value_type::str)
            return b.fail(std::string(f) + ": expected bytes or str");
          if (f == "payload")
            out.set_payload(text(*it));
          else
            out.set_error(text(*it));
          return true;
        }
        return false;
      });
    }
    case mp_op::query_prefetch_lookup_hits:
      break;
  }
  return b.fail("no reply transcoder");
}

} // namespace

expected<std::string> grpc_response(const grpc_method& m, const std::optional<std::string>& body) {
  return reply_of(m, body);
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

} // namespace kvs
