// One row per op: how its reply body (msgpack, None) is read into its RPC's
// response message. Everything else a reply goes through, whether a body is
// needed, the message and its serialization, is the one step of `run_row`;
// the reading is over grpc_body_reader.hpp. An op whose response message
// has no fields or one scalar field needs no row (grpc_generic.hpp).
#include "lmcache_grpc/grpc_reply.hpp"

#include "lmcache_grpc/grpc_body_reader.hpp"
#include "lmcache_grpc/grpc_generic.hpp"
#include "lmcache_wire/lmcache_ops.hpp"

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

/// A row: the op and its message's step. `read` is kept type-erased (a
/// function pointer converts to another function pointer type and back
/// unchanged); `run` is the step for the row's message type, which casts it
/// back.
struct reply_row {
  using erased = void (*)();
  mp_op op;
  bool needs_body; ///< a None body is refused ("no reply body")
  erased read;     ///< status (*)(body_reader&, Msg&); nullptr: nothing to read
  expected<std::string> (*run)(const reply_row&, body_reader&, bool has_body);
};

/// The one step: (body needed?) -> read the body into the message -> the
/// message serialized. A None body a row does not need leaves the message
/// empty.
template <class Msg>
expected<std::string> run_row(const reply_row& row, body_reader& b, bool has_body) {
  if (row.needs_body && !has_body)
    return b.fail("no reply body");
  Msg out;
  if (has_body && row.read)
    if (auto s = reinterpret_cast<status (*)(body_reader&, Msg&)>(row.read)(b, out); !s)
      return s.error_value();
  return out.SerializeAsString();
}

template <class Msg>
reply_row row(mp_op op, status (*read)(body_reader&, Msg&), bool needs_body = true) {
  return {op, needs_body, reinterpret_cast<reply_row::erased>(read), &run_row<Msg>};
}

// -- Readers more than one row has ----------------------------------------------

/// (event_handle: bytes, ok: bool)
template <class Msg>
status event_result(body_reader& b, Msg& msg) {
  pb::EventIpcHandleResult out;
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
  *msg.mutable_result() = out;
  return {};
}

// Fields more than one map body has.
template <class Msg>
expected<bool> success(body_reader& b, Msg& out) {
  return b.field(value_type::boolean, "success",
                 [&](const item& it) { out.set_success(it.u != 0); });
}

template <class Msg>
expected<bool> context(body_reader& b, Msg& out) {
  auto raw = b.raw_value("context");
  if (!raw)
    return raw.error_value();
  out.set_encoded_context(std::string{*raw});
  return true;
}

// -- Readers of one row's map body: each field the response has (false: the
// value is skipped) ----------------------------------------------------------------

status engine_driven_context(body_reader& b, pb::RegisterKvCacheEngineDrivenContextResponse& out) {
  return each_field(b, [&](std::string_view f) -> expected<bool> {
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

status prepare_store(body_reader& b, pb::PrepareStoreResponse& out) {
  return each_field(b, [&](std::string_view f) -> expected<bool> {
    if (f != "context")
      return false;
    return context(b, out);
  });
}

status prepare_retrieve(body_reader& b, pb::PrepareRetrieveResponse& out) {
  return each_field(b, [&](std::string_view f) -> expected<bool> {
    if (f == "success")
      return success(b, out);
    if (f == "data")
      return b.field(value_type::bin, "data", [&](const item& it) { out.set_data(text(it)); });
    if (f == "context")
      return context(b, out);
    return false;
  });
}

status server_module_call(body_reader& b, pb::ServerModuleCallResponse& out) {
  return each_field(b, [&](std::string_view f) -> expected<bool> {
    if (f == "success")
      return success(b, out);
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

// The ops whose response is more than one scalar field. One whose response
// has no fields (LMCache's None-returning ops) or a single scalar field
// (an int, bool, str or bytes body) needs no row (grpc_generic.hpp).
// query_prefetch_lookup_hits has no gRPC method: no row ("no reply
// transcoder").
const reply_row rows[] = {
  row<pb::StoreResponse>(mp_op::store, event_result),
  row<pb::RetrieveResponse>(mp_op::retrieve, event_result),
  row<pb::GetExperimentalResponse>(
    mp_op::get_experimental,
    [](body_reader& b, pb::GetExperimentalResponse& out) -> status {
      auto names = b.array_of("names", value_type::str, "names[]",
                              [&](const item& it) { out.add_names(text(it)); });
      if (!names)
        return names.error_value();
      return {};
    }),
  row<pb::RegisterKvCacheEngineDrivenContextResponse>(
    mp_op::register_kv_cache_engine_driven_context, engine_driven_context),
  row<pb::PrepareStoreResponse>(mp_op::prepare_store, prepare_store),
  row<pb::PrepareRetrieveResponse>(mp_op::prepare_retrieve, prepare_retrieve),
  row<pb::ServerModuleCallResponse>(mp_op::server_module_call, server_module_call),
  row<pb::ServerModuleCallResponse>(mp_op::server_module_affinity_call, server_module_call),
};

const reply_row* find_row(mp_op op) {
  for (const auto& r : rows)
    if (r.op == op)
      return &r;
  return nullptr;
}

} // namespace

expected<std::string> grpc_response(const grpc_method& m, const std::optional<std::string>& body) {
  body_reader b{body ? std::string_view{*body} : std::string_view{}, op_name(m)};
  const auto* r = find_row(m.op);
  if (!r) {
    if (auto generic = grpc_generic_response(op_row(m.op), b, body.has_value()))
      return std::move(*generic);
    return b.fail("no reply transcoder");
  }
  return r->run(*r, b, body.has_value());
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
