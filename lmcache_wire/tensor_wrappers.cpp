// The KV-cache wrappers of register_kv_cache (see tensor_wrappers.hpp):
// LMCache 0.5.6's data-only descriptor and kvsidecar's host shared-memory
// map, read with the LMCache typed reads; legacy pickles go to the strict
// pickle reader. Never throws.
#include "lmcache_wire/tensor_wrappers.hpp"
#include "lmcache_wire/lmcache_reads.hpp"
#include "lmcache_wire/pickle_reader.hpp"
#include "lmcache_wire/tensor_view.hpp"

#include <utility>

namespace kvs {
namespace {

using namespace lmcache_wire;

// ---------------------------------------------------------------------------
// KV-cache wrappers
// ---------------------------------------------------------------------------

/// TensorMetadata (ipc_wire.py): every field required, unknown ones refused.
status read_tensor_metadata(cursor& c, const std::string& where, tensor_desc& out) {
  required req{{{"dtype", false}, {"shape", false}, {"stride", false}, {"storage_offset", false}, {"device_uuid", false}}};
  std::string dtype;
  std::vector<int64_t> shape, stride;
  int64_t storage_offset = 0;
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "dtype") return read_str(c, w, dtype);
    if (f == "shape") return read_int_array(c, w, shape, true);
    if (f == "stride") return read_int_array(c, w, stride, true);
    if (f == "storage_offset") return read_nonneg(c, w, storage_offset);
    if (f == "device_uuid") return read_str(c, w, out.device_uuid);
    known = false;
    return {};
  });
  if (!e) return e;
  if (auto r = req.check(where, "TensorMetadata"); !r) return r;
  // Stash for apply_tensor_view once the storage size is known.
  out.dtype = std::move(dtype);
  out.shape = std::move(shape);
  out.stride = std::move(stride);
  out.storage_offset = storage_offset;
  return {};
}

status read_torch_share(cursor& c, const std::string& where, torch_cuda_share& s) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n); !e) return e;
  if (n != 8) return fail(where, "expected the 8-element storage._share_cuda_() tuple, got " + std::to_string(n));
  if (auto e = read_int(c, at_index(where, 0), s.device); !e) return e;
  if (auto e = read_opt_bin(c, at_index(where, 1), s.mem_handle); !e) return e;
  if (auto e = read_nonneg(c, at_index(where, 2), s.storage_size_bytes); !e) return e;
  if (auto e = read_nonneg(c, at_index(where, 3), s.storage_offset_bytes); !e) return e;
  if (auto e = read_opt_bin(c, at_index(where, 4), s.ref_counter_handle); !e) return e;
  if (auto e = read_nonneg(c, at_index(where, 5), s.ref_counter_offset); !e) return e;
  if (auto e = read_opt_bin(c, at_index(where, 6), s.event_handle); !e) return e;
  return read_bool(c, at_index(where, 7), s.event_sync_required);
}

/// Finishes a descriptor: the view check, with LMCache's error text kind.
expected<tensor_desc> finish_view(tensor_desc d, bool check_span) {
  std::string dtype = std::move(d.dtype);
  std::vector<int64_t> shape = std::move(d.shape), stride = std::move(d.stride);
  if (auto e = apply_tensor_view(std::move(dtype), std::move(shape), std::move(stride), d.storage_offset, d, check_span);
      !e)
    return e.error_value();
  return d;
}

/// LMCache 0.5.6 data-only descriptor (ipc_wire.py WireIPCData): a msgspec
/// tagged union, tag field "type", unknown fields refused.
expected<tensor_desc> decode_ipc_descriptor(std::string_view payload) {
  const std::string where = "descriptor";
  // Pass 1: the tag, wherever it sits in the map (msgspec accepts any order).
  std::string tag;
  {
    cursor c(payload);
    auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> status {
      known = f == "type";
      return known ? read_str(c, at_field(where, f), tag) : status{};
    });
    if (!e) return to_wire(e.error_value(), "bad_wrapper");
    if (!c.at_end()) return error{"bad_wrapper", "descriptor: trailing bytes"};
  }
  if (tag.empty()) return error{"bad_wrapper", "descriptor: missing tag field 'type'"};
  if (tag == "cuda_vmm" || tag == "musa" || tag == "npu")
    return error{"unsupported_wrapper", "descriptor type '" + tag + "' is not supported (CUDA IPC and cpu_shm only)"};
  if (tag != "cuda" && tag != "cuda_raw" && tag != "cpu_shm")
    return error{"bad_wrapper", "descriptor: unknown type '" + tag.substr(0, 32) + "'"};

  // Pass 2: the fields of that variant.
  tensor_desc d;
  torch_cuda_share share;
  int64_t version = 0, alloc_offset = 0, nbytes = 0;
  std::string raw_handle;
  required req{{{"version", false}, {"metadata", false}}};
  if (tag == "cuda") req.fields.push_back({"handle", false});
  if (tag == "cuda_raw") req.fields.insert(req.fields.end(), {{"ipc_handle", false}, {"alloc_offset", false}, {"nbytes", false}});
  if (tag == "cpu_shm") req.fields.insert(req.fields.end(), {{"shm_name", false}, {"nbytes", false}});
  cursor c(payload);
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "type") {
      std::string ignored;
      return read_str(c, w, ignored);
    }
    if (f == "version") return read_int(c, w, version);
    if (f == "metadata") return read_tensor_metadata(c, w, d);
    if (tag == "cuda" && f == "handle") return read_torch_share(c, w, share);
    if (tag == "cuda_raw" && f == "ipc_handle") return read_bin(c, w, raw_handle);
    if (tag == "cuda_raw" && f == "alloc_offset") return read_nonneg(c, w, alloc_offset);
    if ((tag == "cuda_raw" || tag == "cpu_shm") && f == "nbytes") return read_nonneg(c, w, nbytes);
    if (tag == "cpu_shm" && f == "shm_name") return read_str(c, w, d.shm_name);
    known = false;
    return {};
  });
  if (!e) return to_wire(e.error_value(), "bad_wrapper");
  if (auto r = req.check(where + " '" + tag + "'", "descriptor"); !r) return to_wire(r.error_value(), "bad_wrapper");
  if (version != 1) return error{"bad_wrapper", "descriptor: version " + std::to_string(version) + " (expected 1)"};

  if (tag == "cuda") {
    if (auto r = apply_torch_cuda_share(share, d); !r) return r.error_value();
  } else if (tag == "cuda_raw") {
    if (raw_handle.size() != 64)
      return error{"bad_wrapper", "descriptor: field 'ipc_handle': expected 64 bytes, got " + std::to_string(raw_handle.size())};
    d.kind = tensor_desc::memory_kind::cuda_ipc;
    d.ipc_mem_handle = std::move(raw_handle);
    d.storage_offset_bytes = static_cast<uint64_t>(alloc_offset);
    d.storage_size_bytes = static_cast<uint64_t>(nbytes);
  } else {
    d.kind = tensor_desc::memory_kind::host_shm;
    d.shm_offset_bytes = 0;
    d.storage_size_bytes = static_cast<uint64_t>(nbytes);
  }
  return finish_view(std::move(d), true);
}

/// kvsidecar's host shared-memory extension (kvs_host_shm_ext).
expected<tensor_desc> decode_host_shm_ext(std::string_view payload) {
  const std::string where = "host_shm";
  tensor_desc d;
  d.kind = tensor_desc::memory_kind::host_shm;
  int64_t offset = 0, storage_offset = 0;
  std::optional<int64_t> nbytes;
  required req{{{"shm_name", false}, {"dtype", false}, {"shape", false}, {"stride", false}}};
  cursor c(payload);
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "shm_name") return read_str(c, w, d.shm_name);
    if (f == "offset") return read_nonneg(c, w, offset);
    if (f == "dtype") return read_str(c, w, d.dtype);
    if (f == "shape") return read_int_array(c, w, d.shape, true);
    if (f == "stride") return read_int_array(c, w, d.stride, true);
    if (f == "storage_offset") return read_nonneg(c, w, storage_offset);
    if (f == "nbytes") {
      int64_t v = 0;
      if (auto r = read_nonneg(c, w, v); !r) return r;
      nbytes = v;
      return {};
    }
    known = false;
    return {};
  });
  if (!e) return to_wire(e.error_value(), "bad_wrapper");
  if (!c.at_end()) return error{"bad_wrapper", "host_shm: trailing bytes"};
  if (auto r = req.check(where, "host_shm"); !r) return to_wire(r.error_value(), "bad_wrapper");
  if (d.shm_name.empty()) return error{"bad_wrapper", "host_shm: empty shm_name"};
  d.shm_offset_bytes = static_cast<uint64_t>(offset);
  d.storage_offset = storage_offset;
  d.storage_size_bytes = nbytes ? static_cast<uint64_t>(*nbytes) : 0;
  return finish_view(std::move(d), nbytes.has_value());
}


} // namespace

expected<tensor_desc> decode_kv_cache_wrapper(int8_t ext_type, std::string_view payload) {
  if (ext_type == kvs_host_shm_ext) return decode_host_shm_ext(payload);
  if (ext_type != lmcache_ipc_wrapper_ext)
    return error{"bad_wrapper", "ext type " + std::to_string(ext_type) + " is not a KV-cache wrapper"};
  // A pickle opens with PROTO (0x80) and its protocol (2..5); a descriptor is
  // one msgpack map, and 0x80 (an empty map) followed by anything is not one.
  if (payload.size() >= 2 && static_cast<uint8_t>(payload[0]) == 0x80 && static_cast<uint8_t>(payload[1]) >= 2 &&
      static_cast<uint8_t>(payload[1]) <= 5)
    return decode_pickled_ipc_wrapper(payload);
  return decode_ipc_descriptor(payload);
}
} // namespace kvs
