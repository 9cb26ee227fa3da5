// The header in front of every chunk kept in an L2 tier (a disk file, a
// Redis value). It lets a reader reject an object that is not the chunk it
// asked for as a miss: a different key, model, layout or size, a truncated
// write, or bytes that are not ours at all.
//
// Layout (64 bytes, little-endian, version 1):
//   0  u64 magic        "KVSL2OBJ"
//   8  u32 version      1
//  12  u32 header_bytes 64
//  16  u64 payload_bytes
//  24  u64 chunk_hash   kvsidecar's prefix hash (cache/chunk_hash.hpp)
//  32  i32 rank         TP rank of the shard
//  36  u32 reserved     0
//  40  u64 model        XXH3 of the model name and cache salt
//  48  u64 layout       the store's layout fingerprint (bytes per chunk slot)
//  56  u64 checksum     XXH3 of bytes 0..55
// The payload (the chunk's bytes, as in the L1 slot) follows. Only the header
// is checksummed: hashing every payload would cost more than the disk read it
// guards (see BENCHMARKS.md), and a truncated payload is caught by the size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvs {

/// Which object, as the store names it.
struct l2_object_id {
  uint64_t hash = 0;
  int32_t rank = 0;
  uint64_t model = 0;  ///< l2_model_fingerprint(model, salt)
  uint64_t layout = 0; ///< what the payload's bytes mean (slot size today)
};

inline constexpr size_t l2_header_bytes = 64;
inline constexpr uint32_t l2_header_version = 1;

uint64_t l2_model_fingerprint(std::string_view model, std::string_view salt);

/// Writes the 64-byte header of `id` with `payload_bytes` into out.
void encode_l2_header(const l2_object_id& id, uint64_t payload_bytes, uint8_t* out);

enum class l2_header_check {
  ok,
  short_object,  ///< fewer than 64 bytes
  bad_magic,
  bad_version,
  bad_checksum,
  wrong_key,     ///< hash or rank differ
  wrong_model,
  wrong_layout,
  wrong_size,    ///< payload_bytes differs from what follows the header
};
const char* to_string(l2_header_check c);

/// Checks a header against what the reader expects. `object_bytes` is the
/// whole object's size (header + payload) as read or stat()ed. With
/// id.model/id.layout 0 those fields are not compared (a directory scan knows
/// no model). On ok, *payload_bytes (if given) is the payload size.
l2_header_check check_l2_header(const uint8_t* header, size_t object_bytes,
                                const l2_object_id& expect, uint64_t* payload_bytes = nullptr);

/// The header's identity fields (for a directory scan). False if malformed.
bool peek_l2_header(const uint8_t* header, l2_object_id* id, uint64_t* payload_bytes);

/// LMCache 0.5.6's L2 key (native_connector_l2_adapter.py):
/// <model>@<kv_rank:08x>@<group:x>@<chunk hash hex>[@<salt>], with
/// kvsidecar's 64-bit chunk hash as 16 hex digits and `prefix` in front.
std::string l2_key_string(std::string_view prefix, std::string_view model, int32_t rank,
                          uint32_t group, uint64_t hash, std::string_view salt);

} // namespace kvs
