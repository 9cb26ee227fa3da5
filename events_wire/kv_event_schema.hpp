// The KV event structs' field names, in vLLM's declaration order, shared by
// the event decoder, the encoder and the pass-through check: one table of
// names for reading and writing. Internal to events_wire/ (callers use
// kv_event_codec.hpp).
#pragma once

#include "msgpack/msgpack_reader.hpp"

#include <cstdint>
#include <cstring>

namespace kvs::event_schema {

struct name_ref {
  const char* s;
  uint8_t n;
};

template <typename T>
T load_raw(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Compares a str's bytes with a field name in word-sized steps (overlapping
/// the last word): names are 4..28 bytes and this runs for every map key.
__attribute__((always_inline)) inline bool same(const uint8_t* a, uint32_t len, name_ref name) {
  const uint32_t n = name.n;
  if (len != n)
    return false;
  const char* b = name.s;
  if (n >= 8) {
    for (uint32_t k = 0; k + 8 <= n; k += 8)
      if (load_raw<uint64_t>(a + k) != load_raw<uint64_t>(b + k))
        return false;
    return load_raw<uint64_t>(a + n - 8) == load_raw<uint64_t>(b + n - 8);
  }
  if (n >= 4)
    return load_raw<uint32_t>(a) == load_raw<uint32_t>(b) &&
           load_raw<uint32_t>(a + n - 4) == load_raw<uint32_t>(b + n - 4);
  for (uint32_t k = 0; k < n; ++k)
    if (a[k] != static_cast<uint8_t>(b[k]))
      return false;
  return true;
}
__attribute__((always_inline)) inline bool same(const msgpack_io::item& key, name_ref name) {
  return same(key.ptr, key.len, name);
}

#define KVS_NAME(lit) name_ref{lit, static_cast<uint8_t>(sizeof(lit) - 1)}

inline constexpr name_ref type_key = KVS_NAME("type");
inline constexpr name_ref tag_stored = KVS_NAME("BlockStored");
inline constexpr name_ref tag_removed = KVS_NAME("BlockRemoved");
inline constexpr name_ref tag_cleared = KVS_NAME("AllBlocksCleared");

/// vLLM 0.33's BlockStored, in declaration order (0.32's: the same without
/// lookahead_token_ids), then the keys other engines add that we map
/// (SGLang's cache_salt).
enum stored_field : int {
  sf_block_hashes,
  sf_parent_block_hash,
  sf_token_ids,
  sf_block_size,
  sf_lora_id,
  sf_medium,
  sf_lora_name,
  sf_extra_keys,
  sf_group_idx,
  sf_kv_cache_spec_kind,
  sf_kv_cache_spec_sliding_window,
  sf_locality,
  sf_ownership,
  sf_session_id,
  sf_lookahead_token_ids,
  sf_vllm_count, ///< vLLM's fields end here (positional arrays stop here too)
  sf_cache_salt = sf_vllm_count, ///< SGLang's map key
  sf_count
};
inline constexpr name_ref stored_names[sf_count] = {
    KVS_NAME("block_hashes"),     KVS_NAME("parent_block_hash"),
    KVS_NAME("token_ids"),        KVS_NAME("block_size"),
    KVS_NAME("lora_id"),          KVS_NAME("medium"),
    KVS_NAME("lora_name"),        KVS_NAME("extra_keys"),
    KVS_NAME("group_idx"),        KVS_NAME("kv_cache_spec_kind"),
    KVS_NAME("kv_cache_spec_sliding_window"), KVS_NAME("locality"),
    KVS_NAME("ownership"),        KVS_NAME("session_id"),
    KVS_NAME("lookahead_token_ids"),
    KVS_NAME("cache_salt"),
};
/// The fields no known engine ever leaves out (tokenspeed's whole struct).
inline constexpr int stored_required = 4;
/// vLLM's BlockStored fields without a default: always written.
inline constexpr int stored_always = sf_extra_keys;

enum removed_field : int {
  rf_block_hashes,
  rf_medium,
  rf_group_idx,
  rf_locality,
  rf_ownership,
  rf_count
};
inline constexpr name_ref removed_names[rf_count] = {
    KVS_NAME("block_hashes"), KVS_NAME("medium"), KVS_NAME("group_idx"),
    KVS_NAME("locality"),     KVS_NAME("ownership"),
};
inline constexpr int removed_required = 1;
inline constexpr int removed_always = rf_group_idx;

#undef KVS_NAME

/// Map entries a vLLM struct can have at most (its fields + the tag): what
/// msgspec sizes the map header for (16 for 0.33's BlockStored: map16).
inline constexpr uint32_t stored_max_entries = sf_vllm_count + 1;
/// vLLM 0.32's BlockStored: every field before lookahead_token_ids, 15
/// entries with the tag: fixmap.
inline constexpr int stored_fields_032 = sf_lookahead_token_ids;
inline constexpr uint32_t stored_max_entries_032 = stored_fields_032 + 1;
static_assert(stored_max_entries_032 <= 15 && stored_max_entries > 15);
inline constexpr uint32_t removed_max_entries = rf_count + 1;

} // namespace kvs::event_schema
