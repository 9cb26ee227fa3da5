// libFuzzer target: the LMCache MP request decoder and the KV-cache wrapper
// decoder. Input layout (so the fuzzer can grow multi-frame requests):
//   byte 0 even: request frames, each [u16 little-endian length][bytes]
//                (a short last frame takes what is left);
//   byte 0 odd:  one wrapper; byte 1 picks ext 1 (even) or kvsidecar's
//                host-shm ext (odd); the rest is the payload.
// The same request frames also go through the subscribe_kv_events argument
// decoder. Whatever the decoders return must be self-consistent; anything
// else traps.
#include "tests/fuzz/fuzz_fail.hpp"
#include "lmcache_wire/lmcache_kv_events.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/tensor_view.hpp"
#include "lmcache_wire/tensor_wrappers.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

void check_desc(const kvs::tensor_desc& d) {
  if (d.shape.size() != d.stride.size() || d.element_size == 0 || d.storage_offset < 0) KVS_FUZZ_FAIL();
  if (d.kind == kvs::tensor_desc::memory_kind::cuda_ipc && d.ipc_mem_handle.size() != 64) KVS_FUZZ_FAIL();
  if (d.kind == kvs::tensor_desc::memory_kind::host_shm && d.shm_name.empty()) KVS_FUZZ_FAIL();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    if (in.empty()) return 0;
    int8_t ext = (static_cast<uint8_t>(in[0]) & 1) ? kvs::kvs_host_shm_ext : kvs::lmcache_ipc_wrapper_ext;
    auto r = kvs::decode_kv_cache_wrapper(ext, in.substr(1));
    if (auto* d = r ? &r.value() : nullptr) check_desc(*d);
    return 0;
  }
  std::vector<std::string_view> frames;
  while (!in.empty() && frames.size() < 16) {
    size_t n = static_cast<uint8_t>(in[0]);
    if (in.size() >= 2) n |= size_t{static_cast<uint8_t>(in[1])} << 8;
    in.remove_prefix(in.size() >= 2 ? 2 : 1);
    if (n > in.size()) n = in.size();
    frames.push_back(in.substr(0, n));
    in.remove_prefix(n);
  }
  // The same frames as subscribe_kv_events' arguments (the bridge decodes
  // that op before the main decoder).
  auto sub = kvs::decode_subscribe_kv_events(frames);
  if (auto* e = sub ? nullptr : &sub.error_value(); e && e->kind.empty())
    KVS_FUZZ_FAIL();
  auto r = kvs::decode_mp_request(frames);
  if (auto* req = r ? &r.value() : nullptr) {
    if (req->uid_frame != frames[0] || req->op_frame != frames[1]) KVS_FUZZ_FAIL();
    if (auto* reg = std::get_if<kvs::register_kv_cache_req>(&req->body))
      for (const auto& d : reg->kv_caches) check_desc(d);
  } else if (r.error_value().kind.empty()) {
    KVS_FUZZ_FAIL();
  }
  return 0;
}
