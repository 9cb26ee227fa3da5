// The body decoder's readers for the types with rules of their own (the
// cache key, the layout hints, the KV-cache wrappers, the engine type, a
// timeout); every other member is read generically from its struct's field
// list (lmcache_body_decode.hpp). Never throws.
#include "lmcache_wire/lmcache_body_decode.hpp"

#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/tensor_wrappers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace kvs::lmcache_wire {

status read_value(cursor& c, const std::string& where, cache_key& k) {
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

status read_value(cursor& c, const std::string& where, layout_hints& h) {
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

status read_value(cursor& c, const std::string& where, engine_type& out) {
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

status read_value(cursor& c, const std::string& where, std::vector<tensor_desc>& out) {
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

status read_value(cursor& c, const std::string& where, double& out) {
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

const char* op_args::arg_name(size_t k) const { return row_.arg_names[k] ? row_.arg_names[k] : "?"; }

status decode_body(const mp_op_row& row, const std::vector<std::string_view>& frames,
                   mp_request_body& body) {
  if (!row.decode)
    return fail("op", "no decoder");
  return row.decode(op_args(row, frames), body);
}

} // namespace kvs::lmcache_wire
