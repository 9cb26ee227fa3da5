// One row per request message: the frames after its key, in the order
// LMCache's ZeroMQ client of the release sends the op's arguments
// (mq_protocol / custom_types.py). Everything else a request goes through,
// parse, the release check and the key, is the one step of
// grpc_request_step.hpp. An op whose arguments are all plain needs no row
// (grpc_generic.hpp).
#include "lmcache_grpc/grpc_request_frames.hpp"

#include "lmcache_grpc/grpc_generic.hpp"
#include "lmcache_grpc/grpc_request_step.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/tensor_wrappers.hpp"

#include "engine_driven_service.pb.h"
#include "extension_service.pb.h"
#include "kv_event_service.pb.h"
#include "lmcache_driven_service.pb.h"
#include "lookup_service.pb.h"
#include "management_service.pb.h"

#include <google/protobuf/stubs/logging.h>

namespace kvs {

namespace pb = lmcache::mp;
using grpc_request::arg_frames;
using grpc_request::frames_t;
using grpc_request::row_of;
using msgpack_io::writer;

namespace {

/// A row: the op (subscribe_kv_events included) and its message's step.
/// The row's functions are kept type-erased (a function pointer converts to
/// another function pointer type and back unchanged); `run` is the step for
/// the row's message type, which casts them back.
struct request_row {
  using erased = void (*)();
  mp_op op;
  erased frames;
  erased shows_057;
  expected<frames_t> (*run)(const request_row&, std::string_view, client_release);
};

template <class Msg>
expected<frames_t> run_row(const request_row& row, std::string_view bytes, client_release dialect) {
  const row_of<Msg> r{reinterpret_cast<void (*)(const Msg&, arg_frames&)>(row.frames),
                      reinterpret_cast<bool (*)(const Msg&)>(row.shows_057)};
  return grpc_request::transcode(r, bytes, dialect);
}

template <class Msg>
request_row row(mp_op op, void (*frames)(const Msg&, arg_frames&) = nullptr,
                bool (*shows_057)(const Msg&) = nullptr) {
  return {op, reinterpret_cast<request_row::erased>(frames),
          reinterpret_cast<request_row::erased>(shows_057), &run_row<Msg>};
}

void register_kv_cache(const pb::RegisterKvCacheRequest& r, arg_frames& a) {
  a.sint(r.instance_id());
  a.add([&](writer& w) {
    // DeviceIPCWrapper.Serialize bytes: the payload of ext 1 on ZeroMQ.
    w.array(static_cast<uint32_t>(r.kv_cache_size()));
    for (const auto& t : r.kv_cache())
      w.ext(lmcache_ipc_wrapper_ext, t.descriptor_payload());
  });
  a.str(r.model_name());
  a.sint(r.world_size());
  a.str(r.engine_type());
  a.mapping(r.encoded_layout_hints(), "encoded_layout_hints");
  a.add([&](writer& w) {
    w.array(static_cast<uint32_t>(r.engine_group_infos_size()));
    for (const auto& g : r.engine_group_infos()) {
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
  });
}

void register_engine_driven_context(const pb::RegisterKvCacheEngineDrivenContextRequest& r,
                                    arg_frames& a) {
  // proto3 drops an empty group_layouts: the latched release decides.
  const bool v57 = a.release() == client_release::v0_5_7 || r.group_layouts_size() > 0;
  a.add([&](writer& w) {
    w.map(v57 ? 10 : 9);
    w.key("instance_id");
    w.sint(r.instance_id());
    w.key("model_name");
    w.str(r.model_name());
    w.key("world_size");
    w.sint(r.world_size());
    w.key("block_size");
    w.sint(r.block_size());
    w.key("num_layers");
    w.sint(r.num_layers());
    w.key("hidden_dim_size");
    w.sint(r.hidden_dim_size());
    w.key("dtype_str");
    w.str(r.dtype_str());
    w.key("use_mla");
    w.boolean(r.use_mla());
    w.key("num_physical_slots");
    if (r.has_num_physical_slots())
      w.sint(r.num_physical_slots());
    else
      w.nil();
    if (!v57)
      return;
    w.key("group_layouts");
    w.array(static_cast<uint32_t>(r.group_layouts_size()));
    for (const auto& g : r.group_layouts()) {
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
  });
}

void report_block_allocation(const pb::ReportBlockAllocationRequest& r, arg_frames& a) {
  a.sint(r.instance_id());
  a.str(r.model_name());
  a.add([&](writer& w) {
    w.array(static_cast<uint32_t>(r.records_size()));
    for (const auto& rec : r.records()) {
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
  });
}

void server_module_call(const pb::ServerModuleCallRequest& r, arg_frames& a) {
  a.add([&](writer& w) {
    w.map(2);
    w.key("method");
    w.str(r.method());
    w.key("payload");
    w.bin(r.payload());
  });
}

// The rows, for the messages with an argument of a shape of its own (lists,
// records, wrappers, 0.5.7's extra lists, the stream). A message with a key
// gets its key frame first (the step); the row lists what follows. A message
// whose arguments are all plain (the key, ints, strs, bytes, bools, floats)
// needs no row: grpc_generic.hpp writes it from its op row's arguments.
// Neither: the op is refused ("no request transcoder").
const request_row rows[] = {
  // LMCacheDrivenService
  row<pb::RegisterKvCacheRequest>(mp_op::register_kv_cache, register_kv_cache),
  row<pb::StoreRequest>(mp_op::store,
                        [](const auto& r, arg_frames& a) {
                          a.sint(r.instance_id());
                          a.block_groups(r.gpu_block_ids());
                          a.bin(r.event_ipc_handle());
                        }),
  row<pb::RetrieveRequest>(mp_op::retrieve,
                           [](const auto& r, arg_frames& a) {
                             a.sint(r.instance_id());
                             a.block_groups(r.gpu_block_ids());
                             a.bin(r.event_ipc_handle());
                             a.sint(r.skip_first_n_tokens());
                           }),
  // LookupService
  row<pb::FreeLookupLocksRequest>(
    mp_op::free_lookup_locks,
    [](const auto& r, arg_frames& a) {
      a.sint(r.tp_size());
      a.list_057("extra_ranges", r.extra_ranges(), [](writer& w, const auto& e) {
        w.array(2);
        w.sint(e.start());
        w.sint(e.end());
      });
    },
    [](const auto& r) { return r.extra_ranges_size() > 0; }),
  // EngineDrivenService
  row<pb::RegisterKvCacheEngineDrivenContextRequest>(
    mp_op::register_kv_cache_engine_driven_context, register_engine_driven_context),
  row<pb::PrepareStoreRequest>(
    mp_op::prepare_store,
    [](const auto& r, arg_frames& a) {
      a.sint(r.instance_id());
      a.list_057("skipped_chunks", r.skipped_chunks(), [](writer& w, const auto& g) {
        w.array(static_cast<uint32_t>(g.indices_size()));
        for (auto i : g.indices())
          w.sint(i);
      });
    },
    [](const auto& r) { return r.skipped_chunks_size() > 0; }),
  // Management (0.5.7; 0.5.6's Controller / Debug / Observability services)
  row<pb::ReportBlockAllocationRequest>(mp_op::report_block_allocation, report_block_allocation),
  // Extension (0.5.7; 0.5.6's ControllerService has the first)
  row<pb::ServerModuleCallRequest>(mp_op::server_module_call, server_module_call),
  row<pb::ServerModuleCallRequest>(mp_op::server_module_affinity_call, server_module_call),
  // KVEventService (0.5.7; 0.5.6's ObservabilityService): server streaming.
  row<pb::SubscribeKvEventsRequest>(
    mp_op::subscribe_kv_events,
    [](const auto& r, arg_frames& a) {
      a.sint(r.instance_id());
      a.str(r.model_name());
      a.sint(r.cursor());
      a.sint(r.max_events());
    }),
};

const request_row* find_row(const grpc_method& m) {
  for (const auto& r : rows)
    if (r.op == m.op)
      return &r;
  return nullptr;
}

void drop_protobuf_log(google::protobuf::LogLevel, const char*, int, const std::string&) {}

} // namespace

expected<std::vector<std::string>> grpc_request_frames(const grpc_method& m,
                                                      std::string_view bytes,
                                                      client_release dialect, uint64_t call_id) {
  const auto* r = find_row(m);
  std::optional<expected<grpc_request::frames_t>> generic;
  if (!r && !(generic = grpc_generic_request(op_row(m.op), bytes, dialect)))
    return grpc_bad_request(op_name(m), "no request transcoder");
  auto args = r ? r->run(*r, bytes, dialect) : std::move(*generic);
  if (!args)
    return args.error_value();
  std::vector<std::string> out;
  out.reserve(args->size() + 2);
  out.push_back(grpc_request::frame([&](writer& w) { w.uint(call_id); }));
  out.push_back(grpc_request::frame([&](writer& w) { w.str(op_name(m)); }));
  for (auto& f : *args)
    out.push_back(std::move(f));
  return out;
}

error grpc_bad_request(std::string_view where, std::string why) {
  return error{"bad_request", std::string(where) + ": " + std::move(why)};
}

void silence_protobuf_log() {
  google::protobuf::SetLogHandler(&drop_protobuf_log);
}

} // namespace kvs
