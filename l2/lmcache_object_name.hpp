// LMCache's L2 object names (l2.format = "lmcache"), so kvsidecar and
// LMCache 0.5.6 / 0.5.7 servers find each other's chunks in one Redis or one
// folder. An LMCache ObjectKey is (model_name, kv_rank, object_group_id,
// chunk_hash, cache_salt):
//
//   Redis (resp adapter, native_connector_l2_adapter._object_key_to_string):
//     <model>@<kv_rank:08x>@<group:x>@<chunk hash hex>[@<salt>]
//   file  (fs adapter, fs_l2_adapter._object_key_to_filename), in the folder:
//     <model with "/" as "-SEP-">@0x<kv_rank:08x>@<group:x>@<chunk hash hex>[@<salt>].data
//
// kv_rank is ObjectKey.ComputeKVRank with one node per world:
// (world_size << 24) | (rank << 16) | (world_size << 8) | rank. The chunk
// hash is LMCache's (cache/lmcache_token_hash.hpp), 32 bytes. The value is
// the chunk's bytes alone, no header: what it means (layout, length, dtype)
// comes from the registration, and an object of another length is a miss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvs {

/// ObjectKey.ComputeKVRank(world_size, rank, world_size, rank).
uint32_t lmcache_kv_rank(int32_t world_size, int32_t rank);

/// What names one LMCache object. `chunk_hash` is the raw digest bytes.
struct lmcache_object_key {
  std::string_view model;
  uint32_t kv_rank = 0;
  uint32_t group = 0;
  std::string_view chunk_hash;
  std::string_view salt;
};

/// Whether a model name and salt can name LMCache objects: ObjectKey's own
/// invariants (no '@', which separates the fields, no NUL; a salt also no
/// '/' or '\\', at most 128 characters). Anything else would let one key's
/// name read as another's (or, in a folder, name another file): such a
/// chunk gets no LMCache name and stays out of L2.
bool lmcache_nameable(std::string_view model, std::string_view salt);

/// The Redis key (with `prefix`, l2.redis.key_prefix, in front: "" for a
/// fleet shared with LMCache, whose resp adapter has no prefix).
std::string lmcache_redis_key(std::string_view prefix, const lmcache_object_key& k);

/// The fs adapter's file name (no directory).
std::string lmcache_file_name(const lmcache_object_key& k);

/// What a file name says, when it is one the fs adapter could have written
/// (4 or 5 '@'-separated fields, ".data", hex fields that parse); nullopt
/// for anything else (a temporary file, another tool's file).
struct lmcache_file_fields {
  std::string model; ///< "-SEP-" turned back into "/"
  uint32_t kv_rank = 0;
  uint32_t group = 0;
  std::string chunk_hash; ///< raw bytes
  std::string salt;
};
std::optional<lmcache_file_fields> parse_lmcache_file_name(std::string_view name);

/// An unsigned 32-bit hex field (Python's int(s, 16): an optional 0x, 1 to 8
/// digits), and an even count of hex digits as bytes: the fields of the
/// names above.
std::optional<uint32_t> parse_hex32(std::string_view s);
std::optional<std::string> parse_hex_bytes(std::string_view s);

} // namespace kvs
