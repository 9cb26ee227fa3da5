// Typed KV-cache events, as vLLM and tokenspeed define them.
//
// These are the values actors exchange; the wire dialects (vLLM tagged maps,
// positional arrays) live in kv_event_codec.hpp. No CAF and no msgpack here,
// so every part of the project can include this cheaply.
#pragma once

#include "core/event_dialect.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace kvs {

/// vLLM `BlockStored` (vLLM 0.33). Fields in vLLM's declaration order; the
/// ones after `lora_name` carry a default of None in vLLM and are omitted
/// when empty.
struct block_stored {
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;
  std::vector<int64_t> token_ids;
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::optional<std::string> medium;
  std::optional<std::string> lora_name;
  /// `extra_keys` is arbitrary msgpack in vLLM (a list of tuples or None): we
  /// relay it verbatim, as the raw msgpack bytes of the value.
  std::optional<std::string> extra_keys_msgpack;
  std::optional<int64_t> group_idx;
  std::optional<std::string> kv_cache_spec_kind;
  std::optional<int64_t> kv_cache_spec_sliding_window;
  std::optional<std::string> locality;
  std::optional<std::string> ownership;
  /// The request context that emitted the event (vLLM main, after ownership).
  std::optional<std::string> session_id;
  /// vLLM 0.33: the tokens beyond each block used in its hash, one list per
  /// block_hashes entry (None when lookahead hashing is off).
  std::optional<std::vector<std::vector<int64_t>>> lookahead_token_ids;
  /// SGLang's salt of the request that stored the blocks (not a vLLM field:
  /// the vllm dialect carries it in extra_keys, see kv_event_codec.hpp).
  std::optional<std::string> cache_salt;
};

/// vLLM `BlockRemoved`.
struct block_removed {
  std::vector<uint64_t> block_hashes;
  std::optional<std::string> medium;
  std::optional<int64_t> group_idx;
  std::optional<std::string> locality;
  std::optional<std::string> ownership;
};

/// vLLM `AllBlocksCleared`.
struct all_blocks_cleared {};

// Field by field (C++17 has no defaulted ==); a field added above must be
// compared here too (block_index.cpp's static_assert on the struct's size
// is the reminder).
inline bool operator==(const block_stored& a, const block_stored& b) {
  return a.block_hashes == b.block_hashes && a.parent_block_hash == b.parent_block_hash &&
         a.token_ids == b.token_ids && a.block_size == b.block_size && a.lora_id == b.lora_id &&
         a.medium == b.medium && a.lora_name == b.lora_name &&
         a.extra_keys_msgpack == b.extra_keys_msgpack && a.group_idx == b.group_idx &&
         a.kv_cache_spec_kind == b.kv_cache_spec_kind &&
         a.kv_cache_spec_sliding_window == b.kv_cache_spec_sliding_window &&
         a.locality == b.locality && a.ownership == b.ownership &&
         a.session_id == b.session_id && a.lookahead_token_ids == b.lookahead_token_ids &&
         a.cache_salt == b.cache_salt;
}
inline bool operator==(const block_removed& a, const block_removed& b) {
  return a.block_hashes == b.block_hashes && a.medium == b.medium &&
         a.group_idx == b.group_idx && a.locality == b.locality && a.ownership == b.ownership;
}
inline bool operator==(const all_blocks_cleared&, const all_blocks_cleared&) { return true; }

using kv_event = std::variant<block_stored, block_removed, all_blocks_cleared>;

/// Which vLLM release's BlockStored the vllm dialect writes. msgspec sizes an
/// omit_defaults struct's map header for all its fields + the tag, however
/// many it leaves out: 0.33's BlockStored (15 fields, lookahead_token_ids the
/// last; 0.34's is the same) always gets map16 (`de 00 NN`), 0.32's (14
/// fields) fixmap (`8N`), 2 bytes fewer per event. Nothing else differs
/// between the two on the wire (BlockRemoved, AllBlocksCleared, the envelope).
/// The tagged-map releases before 0.32 (fewer fields still, fixmap too)
/// write the same bytes as 0.32 for the same event: v0_32 is theirs as well.
enum class vllm_stored_layout : uint8_t {
  v0_33, ///< vLLM 0.33 and later: map16
  v0_32, ///< vLLM 0.32 and earlier tagged maps: fixmap, no lookahead_token_ids
};

/// A payload already exactly as encode_event_batch writes it in `dialect`
/// (kv_event_codec.hpp check_canonical_event_batch): the relay forwards these
/// bytes, rewriting only dp_rank, instead of decoding and re-encoding.
/// What check_canonical_event_batch found in such a payload.
struct canonical_batch {
  double ts = 0.0;
  uint32_t events = 0;            ///< events in the batch
  size_t rank_offset = 0;         ///< byte offset of dp_rank, the last item
  std::optional<int64_t> dp_rank; ///< its value (nil -> nullopt)
  /// Its BlockStored events' layout (one per canonical batch); none without
  /// a BlockStored.
  std::optional<vllm_stored_layout> stored_layout;
};
/// One event of a canonical payload as the pass-through check read it: what
/// the indexer needs of a BlockStored without walking the bytes again.
struct canonical_event {
  uint32_t at = 0;        ///< the event's bytes in the payload
  uint32_t size = 0;
  uint32_t hashes_at = 0; ///< its block hashes: canonical_events::hashes[hashes_at..+hashes)
  uint32_t hashes = 0;
  uint32_t tokens_at = 0; ///< its token ids: canonical_events::tokens[tokens_at..+tokens)
  uint32_t tokens = 0;
  uint32_t tail_at = 0;   ///< a BlockStored's fields after token_ids: [tail_at, at + size)
  bool stored = false;    ///< a BlockStored (anything else: decode `at`/`size`)
  bool has_parent = false;
  bool narrow = true;     ///< every token id fits int32 (else decode the bytes)
  /// Its fields after token_ids are, byte for byte, those of the event just
  /// before it, a BlockStored too.
  bool same_tail = false;
  uint64_t parent = 0;    ///< parent_block_hash, when has_parent
};
/// What the check records of a payload's events (reused from batch to batch
/// by whoever runs the check).
struct canonical_events {
  std::vector<canonical_event> events;
  std::vector<uint64_t> hashes;
  std::vector<int32_t> tokens;
};

/// A read-only array inside a canonical_record.
template <typename T>
struct record_span {
  const T* ptr = nullptr;
  size_t n = 0;
  const T* data() const { return ptr; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  const T* begin() const { return ptr; }
  const T* end() const { return ptr + n; }
  const T& operator[](size_t i) const { return ptr[i]; }
};

/// canonical_events frozen to travel with its batch: the three arrays in one
/// buffer. A record is allocated on the ingest thread and freed on the
/// indexer's, once per batch; one buffer (plus its shared_ptr) instead of
/// three vectors halves the allocations that cross threads there.
class canonical_record {
public:
  explicit canonical_record(const canonical_events& from)
      : buf_(new unsigned char[bytes(from)]) {
    auto* p = buf_.get();
    events = {place(p, from.events), from.events.size()};
    hashes = {place(p, from.hashes), from.hashes.size()};
    tokens = {place(p, from.tokens), from.tokens.size()};
  }

  record_span<canonical_event> events;
  record_span<uint64_t> hashes;
  record_span<int32_t> tokens;

private:
  /// Each array starts 8-byte aligned (what canonical_event needs; a char
  /// array from new[] is aligned for any type that fits).
  template <typename T>
  static size_t padded(const std::vector<T>& v) {
    return (v.size() * sizeof(T) + 7) / 8 * 8;
  }
  static size_t bytes(const canonical_events& f) {
    return padded(f.events) + padded(f.hashes) + padded(f.tokens);
  }
  template <typename T>
  static const T* place(unsigned char*& p, const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 8);
    auto* at = reinterpret_cast<T*>(p);
    if (!v.empty())
      std::memcpy(at, v.data(), v.size() * sizeof(T));
    p += padded(v);
    return at;
  }
  std::unique_ptr<unsigned char[]> buf_;
};

struct canonical_wire {
  std::shared_ptr<const std::string> bytes;
  event_dialect dialect = event_dialect::vllm;
  canonical_batch layout;
  /// Set by the ingest bridge: the events as the check read them.
  std::shared_ptr<const canonical_record> events;
};

/// One `KVEventBatch`: `[ts, events, dp_rank]` on the wire.
struct kv_event_batch {
  double ts = 0.0;
  /// Empty when `wire` is set: a pass-through batch is not decoded
  /// (decode_event_batch(*wire->bytes) gives its events where needed).
  std::vector<kv_event> events;
  std::optional<int64_t> dp_rank;
  /// Set by the ingest bridge when the engine's bytes can pass through.
  std::optional<canonical_wire> wire;
  /// The BlockStored layout the vllm dialect writes for this batch:
  /// decode_event_batch says v0_32 when every BlockStored came as vLLM
  /// 0.32's msgspec writes it (kv_event_codec.hpp), so a 0.32 engine's batch
  /// is re-encoded as that engine's own bytes.
  vllm_stored_layout stored_layout = vllm_stored_layout::v0_33;

  size_t event_count() const { return wire ? wire->layout.events : events.size(); }
};

/// Batches travelling together between actors: a producer hands over
/// everything one wake-up gave it in one message (fewer hops under load).
struct kv_event_batches {
  std::vector<kv_event_batch> items;
};

} // namespace kvs
