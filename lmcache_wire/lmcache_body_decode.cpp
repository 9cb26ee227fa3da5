// The body decoder: the argument frames of one LMCache MP op into its request
// struct (see lmcache_protocol.hpp). Which decoder an op takes is its row's
// `decode` (lmcache_ops.cpp); the frame-level decoding (op, arity, release)
// is lmcache_decode.cpp.
//
// Reads msgpack through the shared streaming reader (lmcache_reads.hpp): no
// intermediate object tree, no allocation sized by an untrusted count (a
// count is checked against the bytes left before anything is reserved), no
// recursion deeper than the fixed shapes LMCache sends (the one free-form
// value, request_configs, is skipped iteratively and kept raw). Type rules
// follow msgspec's strict decoding, which is what LMCache's own server
// applies, so whatever LMCache would reject is rejected here with the place
// named. Never throws.
#include "lmcache_wire/lmcache_body_decode.hpp"

#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_reads.hpp"
#include "lmcache_wire/tensor_wrappers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace kvs::lmcache_wire {
namespace {

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

} // namespace

// ---------------------------------------------------------------------------
// The argument frames of one request, read by position
// ---------------------------------------------------------------------------

class op_args {
public:
  op_args(const mp_op_row& row, const std::vector<std::string_view>& frames)
      : row_(row), frames_(frames) {}

  size_t size() const { return frames_.size(); }

  /// Decodes argument `k` whole with `fn`, naming it in errors.
  template <class F>
  status arg(size_t k, F&& fn) const {
    return arg_frame(frames_[k], "arg " + std::to_string(k) + " '" + row_.arg_names[k] + "'",
                     std::forward<F>(fn));
  }
  status key(size_t k, cache_key& out) const {
    return arg(k, [&](cursor& c, const std::string& w) { return read_cache_key(c, w, out); });
  }
  status integer(size_t k, int64_t& out) const {
    return arg(k, [&](cursor& c, const std::string& w) { return read_int(c, w, out); });
  }
  status string(size_t k, std::string& out) const {
    return arg(k, [&](cursor& c, const std::string& w) { return read_str(c, w, out); });
  }
  status blocks(size_t k, std::vector<std::vector<int64_t>>& out) const {
    return arg(k, [&](cursor& c, const std::string& w) { return read_block_ids(c, w, out); });
  }
  status binary(size_t k, std::string& out) const {
    return arg(k, [&](cursor& c, const std::string& w) { return read_bin(c, w, out); });
  }

private:
  const mp_op_row& row_;
  const std::vector<std::string_view>& frames_;
};

status decode_body(const mp_op_row& row, const std::vector<std::string_view>& frames,
                   mp_request_body& body) {
  if (!row.decode)
    return fail("op", "no decoder");
  return row.decode(op_args(row, frames), body);
}

// ---------------------------------------------------------------------------
// One decoder per request shape, in LMCache's argument order. Each returns
// the first error, with the argument and the place named.
// ---------------------------------------------------------------------------

namespace body {

/// Runs the reads in order, stopping at the first error.
template <class... R>
status all(R&&... reads) {
  status s;
  ((s ? (void)(s = reads()) : (void)0), ...);
  return s;
}

status register_kv_cache(const op_args& a, mp_request_body& body) {
  register_kv_cache_req r;
  auto e = all([&] { return a.integer(0, r.instance_id); },
               [&] { return a.arg(1, [&](cursor& c, const std::string& w) { return read_kv_caches(c, w, r.kv_caches); }); },
               [&] { return a.string(2, r.model_name); },
               [&] { return a.integer(3, r.world_size); },
               [&] { return a.arg(4, [&](cursor& c, const std::string& w) { return read_engine_type(c, w, r.engine); }); },
               [&] { return a.arg(5, [&](cursor& c, const std::string& w) { return read_layout_hints(c, w, r.hints); }); },
               [&] {
                 return a.arg(6, [&](cursor& c, const std::string& w) -> status {
                   uint32_t n = 0;
                   if (auto h = read_header(c, w, mk::array, n); !h) return h;
                   for (uint32_t g = 0; g < n; ++g) {
                     r.groups.emplace_back();
                     if (auto x = read_group(c, at_index(w, g), r.groups.back()); !x) return x;
                   }
                   return {};
                 });
               });
  if (e) body = std::move(r);
  return e;
}

/// Requests that are only an instance id (unregister_kv_cache,
/// unregister_kv_cache_engine_driven_context).
template <class Req>
status instance_only(const op_args& a, mp_request_body& body) {
  Req r;
  auto e = a.integer(0, r.instance_id);
  if (e) body = r;
  return e;
}
template status instance_only<unregister_kv_cache_req>(const op_args&, mp_request_body&);
template status instance_only<unregister_engine_driven_req>(const op_args&, mp_request_body&);

/// Requests that are only a request id (the prefetch queries, end_session).
template <class Req>
status request_id_only(const op_args& a, mp_request_body& body) {
  Req r;
  auto e = a.string(0, r.request_id);
  if (e) body = std::move(r);
  return e;
}
template status request_id_only<query_prefetch_status_req>(const op_args&, mp_request_body&);
template status request_id_only<query_prefetch_lookup_hits_req>(const op_args&, mp_request_body&);
template status request_id_only<end_session_req>(const op_args&, mp_request_body&);

/// Requests that are (key, instance_id) (prepare_retrieve, commit_retrieve).
template <class Req>
status key_instance(const op_args& a, mp_request_body& body) {
  Req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.instance_id); });
  if (e) body = std::move(r);
  return e;
}
template status key_instance<prepare_retrieve_req>(const op_args&, mp_request_body&);
template status key_instance<commit_retrieve_req>(const op_args&, mp_request_body&);

/// Requests with no arguments.
template <class Req>
status none(const op_args&, mp_request_body& body) {
  body = Req{};
  return {};
}
template status none<get_chunk_size_req>(const op_args&, mp_request_body&);
template status none<noop_req>(const op_args&, mp_request_body&);
template status none<get_experimental_req>(const op_args&, mp_request_body&);

status store(const op_args& a, mp_request_body& body) {
  store_req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.instance_id); },
               [&] { return a.blocks(2, r.block_ids); },
               [&] { return a.binary(3, r.event_ipc_handle); });
  if (e) body = std::move(r);
  return e;
}

status retrieve(const op_args& a, mp_request_body& body) {
  retrieve_req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.instance_id); },
               [&] { return a.blocks(2, r.block_ids); },
               [&] { return a.binary(3, r.event_ipc_handle); },
               [&] { return a.integer(4, r.skip_first_n); });
  if (e) body = std::move(r);
  return e;
}

status lookup(const op_args& a, mp_request_body& body) {
  lookup_req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.tp_size); });
  if (e) body = std::move(r);
  return e;
}

status free_lookup_locks(const op_args& a, mp_request_body& body) {
  free_lookup_locks_req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.tp_size); },
               [&]() -> status {
                 if (a.size() != 3)
                   return {};
                 return a.arg(2, [&](cursor& c, const std::string& w) -> status {
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
               });
  if (e) body = std::move(r);
  return e;
}

status wait_prefetch_status(const op_args& a, mp_request_body& body) {
  wait_prefetch_status_req r;
  auto e = all([&] { return a.string(0, r.request_id); },
               [&] { return a.arg(1, [&](cursor& c, const std::string& w) { return read_timeout(c, w, r.timeout_s); }); });
  if (e) body = std::move(r);
  return e;
}

status clear(const op_args& a, mp_request_body& body) {
  clear_req r;
  status e;
  if (a.size() > 0)
    e = a.arg(0, [&](cursor& c, const std::string& w) { return read_bool(c, w, r.force); });
  if (e) body = r;
  return e;
}

status ping(const op_args& a, mp_request_body& body) {
  ping_req r;
  auto e = a.arg(0, [&](cursor& c, const std::string& w) { return read_opt_int(c, w, r.instance_id); });
  if (e) body = r;
  return e;
}

status register_engine_driven(const op_args& a, mp_request_body& body) {
  register_engine_driven_req r;
  auto e = a.arg(0, [&](cursor& c, const std::string& w) { return read_engine_driven_payload(c, w, r); });
  if (e) body = std::move(r);
  return e;
}

status prepare_store(const op_args& a, mp_request_body& body) {
  prepare_store_req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.instance_id); },
               [&]() -> status {
                 if (a.size() != 3)
                   return {};
                 return a.arg(2, [&](cursor& c, const std::string& w) -> status {
                   uint32_t n = 0;
                   if (auto h = read_header(c, w, mk::array, n); !h) return h;
                   for (uint32_t g = 0; g < n; ++g) {
                     r.skipped_chunks.emplace_back();
                     if (auto p = read_int_array(c, at_index(w, g), r.skipped_chunks.back(), true); !p) return p;
                   }
                   return {};
                 });
               });
  if (e) body = std::move(r);
  return e;
}

status commit_store(const op_args& a, mp_request_body& body) {
  commit_store_req r;
  auto e = all([&] { return a.key(0, r.key); }, [&] { return a.integer(1, r.instance_id); },
               [&] { return a.binary(2, r.cpu_data); });
  if (e) body = std::move(r);
  return e;
}

status negotiate_chunk_size(const op_args& a, mp_request_body& body) {
  negotiate_chunk_size_req r;
  auto e = a.integer(0, r.required_chunk_alignment);
  if (e) body = r;
  return e;
}

status server_module_call(const op_args& a, mp_request_body& body) {
  server_module_call_req r;
  auto e = a.arg(0, [&](cursor& c, const std::string& w) -> status {
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
  if (e) body = std::move(r);
  return e;
}

status report_block_allocation(const op_args& a, mp_request_body& body) {
  report_block_allocation_req r;
  auto e = all([&] { return a.integer(0, r.instance_id); }, [&] { return a.string(1, r.model_name); },
               [&] {
                 return a.arg(2, [&](cursor& c, const std::string& w) -> status {
                   if (auto h = read_header(c, w, mk::array, r.records); !h) return h;
                   for (uint32_t k = 0; k < r.records; ++k)
                     if (const char* bad = c.skip())
                       return fail(at_index(w, k), std::string("undecodable msgpack (") + bad + ")");
                   return {};
                 });
               });
  if (e) body = std::move(r);
  return e;
}

} // namespace body
} // namespace kvs::lmcache_wire
