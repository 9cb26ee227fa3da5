// LMCache MP request decoding (see lmcache_protocol.hpp).
//
// Reads msgpack through the shared streaming reader (lmcache_reads.hpp): no
// intermediate object tree, no allocation sized by an untrusted count (a
// count is checked against the bytes left before anything is reserved), no
// recursion deeper than the fixed shapes LMCache sends (the one free-form
// value, request_configs, is skipped iteratively and kept raw). Type rules
// follow msgspec's strict decoding, which is what LMCache's own server
// applies, so whatever LMCache would reject is rejected here with the place
// named. Never throws.
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/lmcache_reads.hpp"
#include "lmcache_wire/tensor_wrappers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>

namespace kvs {
namespace {

using namespace lmcache_wire;

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

status read_cache_key(cursor& c, const std::string& where, cache_key& k) {
  // token_ids (0.5.6 and older) or token_bytes (0.5.7): exactly one, checked below.
  required req{{{"model_name", false}, {"world_size", false}, {"worker_id", false},
                {"start", false}, {"end", false}, {"request_id", false}}};
  bool have_ids = false, have_bytes = false, have_readers = false;
  auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "model_name") return read_str(c, w, k.model_name);
    if (f == "world_size") return read_int(c, w, k.world_size);
    if (f == "worker_id") return read_opt_int(c, w, k.worker_id);
    if (f == "start") return read_int(c, w, k.start);
    if (f == "end") return read_int(c, w, k.end);
    if (f == "request_id") return read_str(c, w, k.request_id);
    if (f == "num_kv_readers") {
      have_readers = true;
      return read_int(c, w, k.num_kv_readers);
    }
    if (f == "token_bytes") {
      // 0.5.7 (token_codec.py): the ids packed as big-endian uint32.
      have_bytes = true;
      std::string packed;
      if (auto r = read_bin(c, w, packed); !r) return r;
      if (packed.size() % 4 != 0)
        return fail(w, "token_bytes of " + std::to_string(packed.size()) +
                           " byte(s) is not a whole number of 4-byte token ids");
      k.token_ids.resize(packed.size() / 4);
      const auto* p = reinterpret_cast<const uint8_t*>(packed.data());
      for (size_t t = 0; t < k.token_ids.size(); ++t, p += 4)
        k.token_ids[t] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
      return {};
    }
    if (f == "token_ids") {
      have_ids = true;
      uint32_t n = 0;
      if (auto r = read_header(c, w, mk::array, n); !r) return r;
      k.token_ids.clear();
      k.token_ids.reserve(std::min<uint32_t>(n, k_reserve_cap));
      for (uint32_t t = 0; t < n; ++t) {
        int64_t v = 0;
        if (auto r = read_int_at(c, w, t, v); !r) return r;
        if (v < 0 || v > int64_t{std::numeric_limits<uint32_t>::max()})
          return fail(at_index(w, t), "token id " + std::to_string(v) + " outside uint32");
        k.token_ids.push_back(static_cast<uint32_t>(v));
      }
      return {};
    }
    if (f == "cache_salt") {
      size_t cps = 0;
      if (auto r = read_str(c, w, k.cache_salt, &cps); !r) return r;
      // IPCCacheServerKey.__post_init__ (custom_types.py): isolation salts
      // end up in object names, so these characters and lengths are refused.
      if (k.cache_salt.find_first_of(std::string("@/\\\0", 4)) != std::string::npos)
        return fail(w, "cache_salt must not contain '@', '/', '\\' or NUL");
      if (cps > 128) return fail(w, "cache_salt longer than 128 characters");
      return {};
    }
    if (f == "request_configs") {
      // dict[str, Any] | None: checked to be a str-keyed map, kept raw.
      const uint8_t* begin = c.pos();
      item it;
      if (auto r = read_item(c, w, it); !r) return r;
      if (it.kind == mk::nil) {
        k.request_configs_msgpack.clear();
        return {};
      }
      if (it.kind != mk::map) return wrong_kind(w, "map or nil", it);
      for (uint32_t m = 0; m < it.len; ++m) {
        item key;
        if (auto r = read_item(c, w, key); !r) return r;
        if (key.kind != mk::str) return fail(w, std::string("map key must be str, got ") + mk_name(key.kind));
        if (const char* s = c.skip()) return fail(w, std::string("undecodable msgpack (") + s + ")");
      }
      k.request_configs_msgpack.assign(reinterpret_cast<const char*>(begin), static_cast<size_t>(c.pos() - begin));
      return {};
    }
    known = false;
    return {};
  });
  if (!e) return e;
  if (have_ids == have_bytes)
    return fail(where, have_ids ? "IPCCacheServerKey has both 'token_ids' (0.5.6) and 'token_bytes' (0.5.7)"
                                : "IPCCacheServerKey missing required field 'token_ids' (0.5.6) or "
                                  "'token_bytes' (0.5.7)");
  k.release = have_bytes ? client_release::v0_5_7
              : have_readers ? client_release::v0_5_6
                             : client_release::legacy; // 0.5.3/0.5.4 keys have no num_kv_readers
  return req.check(where, "IPCCacheServerKey");
}

status read_layout_hints(cursor& c, const std::string& where, layout_hints& h) {
  return read_fields(c, where, false, [&](std::string_view f, bool& known) -> status {
    known = true;
    std::string w = at_field(where, f);
    // A fixed-value hint, parsed into its enum here and nowhere else.
    auto literal = [&](auto& out, auto... allowed) -> status {
      std::string s;
      if (auto r = read_str(c, w, s); !r) return r;
      for (auto a : {allowed...})
        if (s == to_string(a)) {
          out = a;
          return {};
        }
      return fail(w, "invalid value '" + s.substr(0, 32) + "'");
    };
    auto integer = [&](std::optional<int64_t>& out) -> status {
      int64_t v = 0;
      if (auto r = read_int(c, w, v); !r) return r;
      out = v;
      return {};
    };
    if (f == "kv_layout")
      return literal(h.kv_layout, vllm_kv_layout::nhd, vllm_kv_layout::hnd, vllm_kv_layout::blhnc,
                     vllm_kv_layout::blnhc);
    if (f == "kv_list_layout")
      return literal(h.kv_list_layout, sglang_kv_list_layout::k_v, sglang_kv_list_layout::unified);
    if (f == "num_kv_heads") return integer(h.num_kv_heads);
    if (f == "tokens_per_block") return integer(h.tokens_per_block);
    if (f == "head_dim") return integer(h.head_dim);
    known = false;
    return {};
  });
}

status read_group(cursor& c, const std::string& where, engine_group_info& g) {
  required req{{{"engine_group_id", false}}};
  auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "engine_group_id") return read_int(c, w, g.engine_group_id);
    if (f == "layer_indices") return read_int_array(c, w, g.layer_indices);
    if (f == "tokens_per_block") return read_int(c, w, g.tokens_per_block);
    if (f == "sw_size_tokens") return read_int(c, w, g.sw_size_tokens);
    if (f == "extra_object_group_tag") return read_int(c, w, g.extra_object_group_tag);
    if (f == "recurrent_state") return read_bool(c, w, g.recurrent_state);
    known = false;
    return {};
  });
  if (!e) return e;
  return req.check(where, "EngineGroupInfo");
}

status read_block_ids(cursor& c, const std::string& where, std::vector<std::vector<int64_t>>& out) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n); !e) return e;
  out.clear();
  for (uint32_t g = 0; g < n; ++g) {
    out.emplace_back();
    if (auto e = read_int_array(c, at_index(where, g), out.back()); !e) return e;
  }
  return {};
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

struct op_info {
  mp_op op;
  const char* name;
  uint8_t min_args;
  uint8_t max_args;
  const char* arg_names[7];
};

constexpr op_info k_ops[] = {
    {mp_op::register_kv_cache, "register_kv_cache", 7, 7,
     {"instance_id", "kv_cache", "model_name", "world_size", "engine_type", "layout_hints", "engine_group_infos"}},
    {mp_op::unregister_kv_cache, "unregister_kv_cache", 1, 1, {"instance_id"}},
    {mp_op::store, "store", 4, 4, {"key", "instance_id", "block_ids", "event_ipc_handle"}},
    {mp_op::retrieve, "retrieve", 5, 5, {"key", "instance_id", "block_ids", "event_ipc_handle", "skip_first_n_tokens"}},
    {mp_op::lookup, "lookup", 2, 2, {"key", "tp_size"}},
    {mp_op::query_prefetch_status, "query_prefetch_status", 1, 1, {"request_id"}},
    {mp_op::wait_prefetch_status, "wait_prefetch_status", 2, 2, {"request_id", "timeout"}},
    {mp_op::query_prefetch_lookup_hits, "query_prefetch_lookup_hits", 1, 1, {"request_id"}},
    {mp_op::free_lookup_locks, "free_lookup_locks", 2, 3, {"key", "tp_size", "extra_ranges"}},
    {mp_op::end_session, "end_session", 1, 1, {"request_id"}},
    {mp_op::clear, "clear", 0, 1, {"force"}},
    {mp_op::get_chunk_size, "get_chunk_size", 0, 0, {}},
    {mp_op::ping, "ping", 1, 1, {"instance_id"}},
    {mp_op::noop, "noop", 0, 0, {}},
    {mp_op::get_experimental, "get_experimental", 0, 0, {}},
    {mp_op::register_kv_cache_engine_driven_context, "register_kv_cache_engine_driven_context", 1, 1,
     {"payload"}},
    {mp_op::unregister_kv_cache_engine_driven_context, "unregister_kv_cache_engine_driven_context",
     1, 1, {"instance_id"}},
    {mp_op::prepare_store, "prepare_store", 2, 3, {"key", "instance_id", "skipped_chunks"}},
    {mp_op::commit_store, "commit_store", 3, 3, {"key", "instance_id", "data"}},
    {mp_op::prepare_retrieve, "prepare_retrieve", 2, 2, {"key", "instance_id"}},
    {mp_op::commit_retrieve, "commit_retrieve", 2, 2, {"key", "instance_id"}},
    {mp_op::report_block_allocation, "report_block_allocation", 3, 3,
     {"instance_id", "model_name", "records"}},
    {mp_op::negotiate_chunk_size, "negotiate_chunk_size", 1, 1, {"required_chunk_alignment"}},
    {mp_op::server_module_call, "server_module_call", 1, 1, {"request"}},
    {mp_op::server_module_affinity_call, "server_module_affinity_call", 1, 1, {"request"}},
};

/// LMCache 0.5.6 operations kvsidecar does not serve, with their legacy ids
/// (0 = routed by name only). Named in errors so logs say what was asked.
struct foreign_op {
  int id;
  const char* name;
};
constexpr foreign_op k_foreign_ops[] = {
    {3, "register_q_cache"},
    {4, "unregister_q_cache"},
    {5, "store_q"},
    {25, "cb_register_rope"},
    {26, "cb_unregister_rope"},
    {27, "cb_retrieve_pre_computed"},
    {28, "cb_unified_lookup"},
    {29, "p2p_lookup_and_lock"},
    {30, "p2p_query_lookup_results"},
    {31, "p2p_unlock_objects"},
    {33, "cb_protocol_handshake"},
    {0, "cb_reorder_plan"},
    {0, "subscribe_kv_events"},
};

/// get_experimental's id in LMCache 0.5.3 / 0.5.4 (0.5.5+: 32).
constexpr int64_t k_legacy_get_experimental_id = 40;

const op_info* find_op(mp_op op) {
  for (const auto& o : k_ops)
    if (o.op == op) return &o;
  return nullptr;
}

error bad_arg(const error& e) { return error{"bad_arg", e.detail}; }

/// Decodes one whole argument frame with `fn`, refusing trailing bytes.
template <class F>
status arg_frame(std::string_view frame, const std::string& where, F&& fn) {
  cursor c(frame);
  if (auto e = fn(c, where); !e) return e;
  if (!c.at_end()) return fail(where, std::to_string(c.left()) + " trailing bytes after the value");
  return {};
}

status read_engine_type(cursor& c, const std::string& where, engine_type& out) {
  std::string s;
  if (auto e = read_str(c, where, s); !e) return e;
  static constexpr std::pair<const char*, engine_type> k_types[] = {
      {"vllm", engine_type::vllm}, {"atom", engine_type::atom}, {"sglang", engine_type::sglang},
      {"trtllm", engine_type::trtllm}, {"mock", engine_type::mock}};
  for (const auto& t : k_types)
    if (s == t.first) {
      out = t.second;
      return {};
    }
  return fail(where, "invalid EngineType '" + s.substr(0, 32) + "'");
}

status read_kv_caches(cursor& c, const std::string& where, std::vector<tensor_desc>& out) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n); !e) return e;
  out.clear(); // no reserve: a tensor_desc is ~50x the byte an element may take
  for (uint32_t k = 0; k < n; ++k) {
    std::string w = at_index(where, k);
    item it;
    if (auto e = read_item(c, w, it); !e) return e;
    if (it.kind != mk::ext) return wrong_kind(w, "ext (a KV-cache wrapper)", it);
    auto r = decode_kv_cache_wrapper(it.ext_type, std::string_view(reinterpret_cast<const char*>(it.ptr), it.len));
    if (!r) return fail(w, to_string(r.error_value()));
    out.push_back(std::move(*r));
  }
  return {};
}

status read_timeout(cursor& c, const std::string& where, double& out) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  if (it.kind == mk::float32 || it.kind == mk::float64)
    out = it.f;
  else if (it.kind == mk::uint)
    out = static_cast<double>(it.u);
  else if (it.kind == mk::sint)
    out = static_cast<double>(it.i);
  else
    return wrong_kind(where, "float", it);
  if (!std::isfinite(out) || out < 0) return fail(where, "timeout must be finite and >= 0");
  return {};
}

/// LMCache's own bound on groups (tensor_wire.py _MAX_GROUP_COUNT).
constexpr uint32_t k_max_group_layouts = 64;

status read_group_layout(cursor& c, const std::string& where, group_layout_desc& g) {
  required req{{{"num_layers", false}, {"hidden_dim_size", false}, {"dtype_str", false},
                {"tokens_per_block", false}}};
  auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "num_layers") return read_int(c, w, g.num_layers);
    if (f == "hidden_dim_size") return read_int(c, w, g.hidden_dim_size);
    if (f == "dtype_str") return read_str(c, w, g.dtype_str);
    if (f == "tokens_per_block") return read_int(c, w, g.tokens_per_block);
    if (f == "window_tokens") return read_int(c, w, g.window_tokens);
    if (f == "kv_size") return read_int(c, w, g.kv_size);
    if (f == "window_chunks") return read_int(c, w, g.window_chunks);
    if (f == "recurrent") return read_bool(c, w, g.recurrent);
    known = false;
    return {};
  });
  if (!e) return e;
  return req.check(where, "GroupLayout");
}

status read_engine_driven_payload(cursor& c, const std::string& where,
                                  register_engine_driven_req& r) {
  required req{{{"instance_id", false}, {"model_name", false}, {"world_size", false},
                {"block_size", false}, {"num_layers", false}, {"hidden_dim_size", false},
                {"dtype_str", false}, {"use_mla", false}}};
  auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "instance_id") return read_int(c, w, r.instance_id);
    if (f == "model_name") return read_str(c, w, r.model_name);
    if (f == "world_size") return read_int(c, w, r.world_size);
    if (f == "block_size") return read_int(c, w, r.block_size);
    if (f == "num_layers") return read_int(c, w, r.num_layers);
    if (f == "hidden_dim_size") return read_int(c, w, r.hidden_dim_size);
    if (f == "dtype_str") return read_str(c, w, r.dtype_str);
    if (f == "use_mla") return read_bool(c, w, r.use_mla);
    if (f == "num_physical_slots") return read_opt_int(c, w, r.num_physical_slots);
    if (f == "group_layouts") {
      uint32_t n = 0;
      if (auto h = read_header(c, w, mk::array, n); !h) return h;
      if (n > k_max_group_layouts)
        return fail(w, std::to_string(n) + " groups, above " + std::to_string(k_max_group_layouts));
      r.group_layouts.emplace();
      for (uint32_t g = 0; g < n; ++g) {
        group_layout_desc gl;
        if (auto x = read_group_layout(c, at_index(w, g), gl); !x) return x;
        r.group_layouts->push_back(std::move(gl));
      }
      return {};
    }
    known = false;
    return {};
  });
  if (!e) return e;
  return req.check(where, "RegisterEngineDrivenContextPayload");
}

/// Decodes the arguments of `op` into its request struct.
status decode_body(const op_info& info, const std::vector<std::string_view>& args, mp_request_body& body) {
  auto where = [&](size_t k) {
    return "arg " + std::to_string(k) + " '" + info.arg_names[k] + "'";
  };
  auto arg = [&](size_t k, auto&& fn) { return arg_frame(args[k], where(k), fn); };
  auto key = [&](size_t k, cache_key& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_cache_key(c, w, out); });
  };
  auto integer = [&](size_t k, int64_t& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_int(c, w, out); });
  };
  auto string = [&](size_t k, std::string& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_str(c, w, out); });
  };
  auto blocks = [&](size_t k, std::vector<std::vector<int64_t>>& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_block_ids(c, w, out); });
  };
  auto binary = [&](size_t k, std::string& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_bin(c, w, out); });
  };

  switch (info.op) {
    case mp_op::register_kv_cache: {
      register_kv_cache_req r;
      if (auto e = integer(0, r.instance_id); !e) return e;
      if (auto e = arg(1, [&](cursor& c, const std::string& w) { return read_kv_caches(c, w, r.kv_caches); }); !e) return e;
      if (auto e = string(2, r.model_name); !e) return e;
      if (auto e = integer(3, r.world_size); !e) return e;
      if (auto e = arg(4, [&](cursor& c, const std::string& w) { return read_engine_type(c, w, r.engine); }); !e) return e;
      if (auto e = arg(5, [&](cursor& c, const std::string& w) { return read_layout_hints(c, w, r.hints); }); !e) return e;
      if (auto e = arg(6, [&](cursor& c, const std::string& w) -> status {
            uint32_t n = 0;
            if (auto h = read_header(c, w, mk::array, n); !h) return h;
            for (uint32_t g = 0; g < n; ++g) {
              r.groups.emplace_back();
              if (auto x = read_group(c, at_index(w, g), r.groups.back()); !x) return x;
            }
            return {};
          });
          !e)
        return e;
      body = std::move(r);
      return {};
    }
    case mp_op::unregister_kv_cache: {
      unregister_kv_cache_req r;
      if (auto e = integer(0, r.instance_id); !e) return e;
      body = r;
      return {};
    }
    case mp_op::store: {
      store_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.instance_id); !e) return e;
      if (auto e = blocks(2, r.block_ids); !e) return e;
      if (auto e = binary(3, r.event_ipc_handle); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::retrieve: {
      retrieve_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.instance_id); !e) return e;
      if (auto e = blocks(2, r.block_ids); !e) return e;
      if (auto e = binary(3, r.event_ipc_handle); !e) return e;
      if (auto e = integer(4, r.skip_first_n); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::lookup: {
      lookup_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.tp_size); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::free_lookup_locks: {
      free_lookup_locks_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.tp_size); !e) return e;
      if (args.size() == 3)
        if (auto e = arg(2, [&](cursor& c, const std::string& w) -> status {
              uint32_t n = 0;
              if (auto h = read_header(c, w, mk::array, n); !h) return h;
              for (uint32_t k = 0; k < n; ++k) {
                std::vector<int64_t> pair;
                if (auto p = read_int_array(c, at_index(w, k), pair); !p) return p;
                if (pair.size() != 2) return fail(at_index(w, k), "a range is [start, end]");
                r.extra_ranges.emplace_back(pair[0], pair[1]);
              }
              return {};
            });
            !e)
          return e;
      body = std::move(r);
      return {};
    }
    case mp_op::query_prefetch_status: {
      query_prefetch_status_req r;
      if (auto e = string(0, r.request_id); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::wait_prefetch_status: {
      wait_prefetch_status_req r;
      if (auto e = string(0, r.request_id); !e) return e;
      if (auto e = arg(1, [&](cursor& c, const std::string& w) { return read_timeout(c, w, r.timeout_s); }); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::query_prefetch_lookup_hits: {
      query_prefetch_lookup_hits_req r;
      if (auto e = string(0, r.request_id); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::end_session: {
      end_session_req r;
      if (auto e = string(0, r.request_id); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::clear: {
      clear_req r;
      if (!args.empty())
        if (auto e = arg(0, [&](cursor& c, const std::string& w) { return read_bool(c, w, r.force); }); !e) return e;
      body = r;
      return {};
    }
    case mp_op::ping: {
      ping_req r;
      if (auto e = arg(0, [&](cursor& c, const std::string& w) { return read_opt_int(c, w, r.instance_id); }); !e) return e;
      body = r;
      return {};
    }
    case mp_op::register_kv_cache_engine_driven_context: {
      register_engine_driven_req r;
      if (auto e = arg(0, [&](cursor& c, const std::string& w) { return read_engine_driven_payload(c, w, r); }); !e)
        return e;
      body = std::move(r);
      return {};
    }
    case mp_op::unregister_kv_cache_engine_driven_context: {
      unregister_engine_driven_req r;
      if (auto e = integer(0, r.instance_id); !e) return e;
      body = r;
      return {};
    }
    case mp_op::prepare_store: {
      prepare_store_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.instance_id); !e) return e;
      if (args.size() == 3)
        if (auto e = arg(2, [&](cursor& c, const std::string& w) -> status {
              uint32_t n = 0;
              if (auto h = read_header(c, w, mk::array, n); !h) return h;
              for (uint32_t g = 0; g < n; ++g) {
                r.skipped_chunks.emplace_back();
                if (auto p = read_int_array(c, at_index(w, g), r.skipped_chunks.back(), true); !p) return p;
              }
              return {};
            });
            !e)
          return e;
      body = std::move(r);
      return {};
    }
    case mp_op::commit_store: {
      commit_store_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.instance_id); !e) return e;
      if (auto e = binary(2, r.cpu_data); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::prepare_retrieve: {
      prepare_retrieve_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.instance_id); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::commit_retrieve: {
      commit_retrieve_req r;
      if (auto e = key(0, r.key); !e) return e;
      if (auto e = integer(1, r.instance_id); !e) return e;
      body = std::move(r);
      return {};
    }
    case mp_op::negotiate_chunk_size: {
      negotiate_chunk_size_req r;
      if (auto e = integer(0, r.required_chunk_alignment); !e) return e;
      body = r;
      return {};
    }
    case mp_op::server_module_call:
    case mp_op::server_module_affinity_call: {
      server_module_call_req r;
      if (auto e = arg(0, [&](cursor& c, const std::string& w) -> status {
            required need{{{"method", false}, {"payload", false}}};
            auto f = read_fields(c, w, false, [&](std::string_view name, bool& known) -> status {
              known = true;
              need.seen(name);
              if (name == "method") return read_str(c, at_field(w, name), r.method);
              if (name == "payload") {
                std::string p;
                if (auto b = read_bin(c, at_field(w, name), p); !b) return b;
                r.payload_bytes = p.size();
                return {};
              }
              known = false;
              return {};
            });
            if (!f) return f;
            return need.check(w, "ServerModuleCallRequest");
          });
          !e)
        return e;
      body = std::move(r);
      return {};
    }
    case mp_op::report_block_allocation: {
      report_block_allocation_req r;
      if (auto e = integer(0, r.instance_id); !e) return e;
      if (auto e = string(1, r.model_name); !e) return e;
      if (auto e = arg(2, [&](cursor& c, const std::string& w) -> status {
            if (auto h = read_header(c, w, mk::array, r.records); !h) return h;
            for (uint32_t k = 0; k < r.records; ++k)
              if (const char* bad = c.skip()) return fail(at_index(w, k), std::string("undecodable msgpack (") + bad + ")");
            return {};
          });
          !e)
        return e;
      body = std::move(r);
      return {};
    }
    case mp_op::get_chunk_size: body = get_chunk_size_req{}; return {};
    case mp_op::noop: body = noop_req{}; return {};
    case mp_op::get_experimental: body = get_experimental_req{}; return {};
  }
  return fail("op", "no decoder");
}

std::string shown(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 48)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return out;
}

/// Resolves the op frame: a legacy id (msgpack int) or a snake_case name.
expected<const op_info*> decode_op(std::string_view frame) {
  if (frame.empty())
    return error{"unsupported_op", "empty op frame (event-stream control: subscribe_kv_events is not served)"};
  cursor c(frame);
  item it;
  if (c.next(it) || !c.at_end()) return error{"unknown_op", "op frame is not one msgpack value"};
  if (it.kind == mk::uint || it.kind == mk::sint) {
    // Ids are small; anything beyond int64 is simply not one of them.
    int64_t id = it.kind == mk::sint ? it.i
                 : it.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1
                                                                                    : static_cast<int64_t>(it.u);
    if (auto op = mp_op_from_id(id)) return find_op(*op);
    // 0.5.3 / 0.5.4 number get_experimental 40 (their ids differ from 25 on).
    if (id == k_legacy_get_experimental_id) return find_op(mp_op::get_experimental);
    for (const auto& f : k_foreign_ops)
      if (f.id != 0 && f.id == id)
        return error{"unsupported_op", std::string("op ") + std::to_string(id) + " (" + f.name + ") is not served"};
    return error{"unknown_op", "unknown legacy op id " + (it.kind == mk::uint ? std::to_string(it.u) : std::to_string(it.i))};
  }
  if (it.kind == mk::str) {
    std::string_view name(reinterpret_cast<const char*>(it.ptr), it.len);
    if (auto op = mp_op_from_name(name)) return find_op(*op);
    for (const auto& f : k_foreign_ops)
      if (name == f.name) return error{"unsupported_op", "op '" + std::string(name) + "' is not served"};
    return error{"unknown_op", "unknown op name '" + shown(name) + "'"};
  }
  return error{"unknown_op", std::string("op frame holds a ") + mk_name(it.kind) + ", not an int or str"};
}


template <class T, class = void>
struct has_key : std::false_type {};
template <class T>
struct has_key<T, std::void_t<decltype(std::declval<const T&>().key.release)>> : std::true_type {};

/// The release a decoded request shows (its key's token form, its argument
/// count, ops only one release has), or an error when it mixes two.
expected<client_release> release_shown(const mp_request& r, std::string_view op_frame, size_t nargs) {
  client_release rel = client_release::unknown;
  std::visit([&](const auto& b) {
    if constexpr (has_key<std::decay_t<decltype(b)>>::value) rel = b.key.release;
  }, r.body);
  switch (r.op) {
    case mp_op::free_lookup_locks:
    case mp_op::prepare_store: {
      // 0.5.7 binds every default, so its calls always carry the third argument.
      const bool three = nargs == 3;
      if (three != (rel == client_release::v0_5_7))
        return error{"bad_arg", std::string(to_string(r.op)) + " with " + std::to_string(nargs) +
                                    " arguments and a key of " +
                                    (rel == client_release::v0_5_7 ? "token_bytes (0.5.7 sends 3 arguments)"
                                                                   : "token_ids (only 0.5.7 sends 3 arguments)")};
      break;
    }
    case mp_op::negotiate_chunk_size:
    case mp_op::server_module_affinity_call:
      rel = client_release::v0_5_7;
      break;
    case mp_op::register_kv_cache_engine_driven_context:
      rel = std::get<register_engine_driven_req>(r.body).group_layouts ? client_release::v0_5_7
                                                                        : client_release::v0_5_6;
      break;
    case mp_op::get_experimental:
      if (op_frame.size() == 1 && static_cast<uint8_t>(op_frame[0]) == k_legacy_get_experimental_id)
        rel = client_release::legacy;
      break;
    default:
      break;
  }
  return rel;
}

} // namespace

// ---------------------------------------------------------------------------
// Public: ops
// ---------------------------------------------------------------------------

const char* to_string(mp_op op) {
  if (const op_info* o = find_op(op)) return o->name;
  return "?";
}

std::optional<mp_op> mp_op_from_name(std::string_view name) {
  for (const auto& o : k_ops)
    if (name == o.name) return o.op;
  return std::nullopt;
}

std::optional<mp_op> mp_op_from_id(int64_t id) {
  // Ops newer than the frozen table (values >= 200) have no id.
  if (id < 0 || id >= static_cast<int64_t>(mp_op::negotiate_chunk_size)) return std::nullopt;
  for (const auto& o : k_ops)
    if (static_cast<int64_t>(o.op) == id) return o.op;
  return std::nullopt;
}

const char* to_string(client_release r) {
  switch (r) {
    case client_release::unknown: return "unknown";
    case client_release::legacy: return "0.5.3-0.5.5";
    case client_release::v0_5_6: return "0.5.6";
    case client_release::v0_5_7: return "0.5.7";
  }
  return "?";
}

expected<mp_request> decode_mp_request(const std::vector<std::string_view>& frames) {
  if (frames.size() < 2)
    return error{"bad_frames", "expected uid, op and arguments; got " + std::to_string(frames.size()) + " frame(s)"};
  mp_request req;
  {
    // The uid is opaque: echoed, never interpreted (LMCache's server does
    // not decode it either, and answers whatever it is).
    cursor c(frames[0]);
    item it;
    int64_t uid = -1;
    if (c.next(it) || !c.at_end() || !as_int64(it, "uid", uid))
      uid = -1;
    req.uid = uid;
  }
  auto op = decode_op(frames[1]);
  if (!op) return op.error_value();
  const op_info& info = **op;
  std::vector<std::string_view> args(frames.begin() + 2, frames.end());
  if (args.size() < info.min_args || args.size() > info.max_args) {
    std::string want = info.min_args == info.max_args
                           ? std::to_string(info.min_args)
                           : std::to_string(info.min_args) + ".." + std::to_string(info.max_args);
    return error{"arity", std::string(info.name) + " takes " + want + " argument(s), got " + std::to_string(args.size())};
  }
  if (auto e = decode_body(info, args, req.body); !e) return bad_arg(e.error_value());
  req.op = info.op;
  auto rel = release_shown(req, frames[1], args.size());
  if (!rel) return rel.error_value();
  req.release = rel.value();
  req.uid_frame.assign(frames[0].data(), frames[0].size());
  req.op_frame.assign(frames[1].data(), frames[1].size());
  return req;
}


} // namespace kvs
