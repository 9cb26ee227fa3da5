// Wire codec for KV event batches: msgpack payload frame <-> kv_event_batch.
//
// Decoding accepts every dialect engines send, even mixed in one batch:
//   - vLLM tagged maps (vLLM >= PR #42892): {"type": "BlockStored", ...}
//   - vLLM positional arrays (older vLLM): ["BlockStored", hashes, parent,
//     tokens, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//     kv_cache_spec_kind, kv_cache_spec_sliding_window, ...] and any shorter
//     arity down to the 4 fields tokenspeed sends;
//   - tokenspeed positional arrays (["BlockStored", hashes, parent, tokens,
//     block_size], ["BlockRemoved", hashes], ["AllBlocksCleared"]).
// Encoding writes exactly the bytes msgspec writes for vLLM's or tokenspeed's
// structs (golden-tested against msgspec in tests/unit/test_events_codec.cpp).
//
// No msgpack and no CAF in this header: callers see only typed values.
#pragma once

#include "events_wire/kv_events.hpp"
#include "core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

struct event_decode_result {
  /// The events that decoded fine, in their order in the frame.
  kv_event_batch batch;
  /// One entry per dropped event, in order. kind is "unknown_tag" (a tag we do
  /// not know: a newer engine's event), "bad_field" (a field missing, of the
  /// wrong type or out of range) or "bad_event" (not a map or array, no tag,
  /// non-string key); detail names the event index and the field.
  std::vector<error> dropped;
};

/// Decodes one payload frame.
///
/// The envelope must be an array of 2 or 3: [ts (float or int), events
/// (array), dp_rank (int or nil)], followed by nothing. Anything else (not
/// msgpack, truncated, trailing bytes, wrong envelope) is an error of kind
/// "not_a_batch"; so is an event that cannot even be skipped (truncated).
/// An event that is well-formed msgpack but not a valid event is dropped alone
/// and reported in `dropped`.
///
/// Field rules (msgspec's, plus what the relay needs):
///   - every field of vLLM 0.33's BlockStored / BlockRemoved is read (maps
///     by name, positional arrays in vLLM's declaration order), and SGLang's
///     BlockStored key `cache_salt` (kept in block_stored::cache_salt).
///   - block hashes: msgpack uint -> as is; negative int -> its two's
///     complement (vLLM's hashes are u64; a consumer that wrote them back as
///     i64 meant the same bits); bin or str -> the low 64 bits of the bytes
///     read big-endian, i.e. int.from_bytes(b, "big") & (2**64 - 1), exactly
///     vLLM's maybe_convert_block_hash (so 32-byte sha256 digests work).
///   - required: BlockStored block_hashes, parent_block_hash, token_ids,
///     block_size; BlockRemoved block_hashes. Every other field may be absent
///     (= None), so older vLLM, tokenspeed and SGLang's map dialect decode too.
///   - block_size must be >= 0; token ids must fit int64; strings must be
///     valid UTF-8 (msgspec consumers reject invalid UTF-8 for the whole batch).
///   - extra_keys must be nil or an array of (nil or array); it is kept as its
///     raw msgpack bytes and relayed verbatim.
///   - unknown map keys and extra trailing array elements are ignored, as
///     msgspec does (newer engines add fields).
///   - batch.stored_layout is v0_32 when the batch has a BlockStored and
///     every BlockStored kept is vLLM 0.32's as its msgspec writes it: a
///     fixmap, "type" first, 0.32's fields only (all 7 without a default,
///     any defaulted ones), in declaration order; else v0_33.
/// No allocation is sized from a length field beyond what the remaining input
/// could hold.
expected<event_decode_result> decode_event_batch(const uint8_t* data, size_t size);

/// Appends the msgpack payload of `batch` to `out` (which the caller reuses
/// between batches to avoid reallocations).
///
/// dialect vllm: msgspec's encoding of vLLM 0.33's KVEventBatch: array
///   envelope [ts float64, events, data_parallel_rank int|nil]; events are
///   maps, "type" first, then the fields in vLLM's declaration order; fields
///   without a default always written (nil for None), defaulted ones only
///   when set. BlockStored's map header is map16 (`de 00 NN`): msgspec sizes
///   it for the struct's 15 fields + tag, not for the entries written; with
///   batch.stored_layout v0_32 it is fixmap (`8N`), as vLLM 0.32 (14 fields)
///   writes it (an event with lookahead_token_ids, which 0.32 lacks, keeps
///   map16).
///   SGLang's cache_salt goes into extra_keys the way vLLM publishes a salt:
///   when the event has no extra_keys and starts a chain (parent None),
///   extra_keys = [("salt",), None, ...] (one entry per block, the salt in
///   the entry of the block at token 0, as vLLM's
///   generate_block_hash_extra_keys does); in a continuation the salt is
///   implied by the parent chain, as in vLLM, and not repeated.
/// dialect tokenspeed: tokenspeed's KVEventBatch: events are positional arrays
///   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size],
///   ["BlockRemoved", block_hashes], ["AllBlocksCleared"]. tokenspeed's structs
///   have no other fields, so every vLLM-only field (lora_id, medium,
///   lora_name, extra_keys, group_idx, kv_cache_spec_*, locality, ownership,
///   session_id, lookahead_token_ids, cache_salt) is dropped: it cannot be
///   represented there.
/// Both: the envelope always has 3 elements (msgspec writes trailing defaults
/// of array_like structs), a missing dp_rank is nil, hashes are msgpack uints
/// (uint64 when >= 2^63), ints use the smallest encoding.
/// Precondition: block_stored::extra_keys_msgpack, when set, holds one
/// complete msgpack value (decode_event_batch guarantees it).
void encode_event_batch(const kv_event_batch& batch, event_dialect dialect, std::string& out);

/// Whether `data` is already exactly what encode_event_batch writes in
/// `dialect` for what decode_event_batch reads from it (dp_rank aside), so
/// the relay can forward the engine's bytes instead of decoding and
/// re-encoding them. Checked in one walk without building any event: every
/// header, int and str in the encoder's smallest form, float64 ts, vLLM's
/// key order with defaulted fields present only when set (map16 for
/// BlockStored, or fixmap without lookahead_token_ids: vLLM 0.32's, which
/// decodes to stored_layout v0_32; one of the two in a batch), tokenspeed's
/// arities, and everything the decoder would
/// refuse or drop (bad UTF-8, out-of-range ints, negative block_size) refused
/// too. Anything else, including SGLang's cache_salt (mapped into
/// extra_keys) and every field the tokenspeed dialect drops, is nullopt: use
/// decode + encode. Never throws.
/// With `events`, it also records each event as it reads it (see
/// canonical_event): the indexer applies BlockStored events from there, with
/// no second walk of the bytes. Left unspecified when the result is nullopt;
/// holds fewer events than the batch (none) for a frame of 4 GiB or more.
std::optional<canonical_batch> check_canonical_event_batch(const uint8_t* data, size_t size,
                                                           event_dialect dialect,
                                                           canonical_events* events = nullptr);

/// Decodes one event from its own bytes (a canonical_event's at/size), with
/// decode_event_batch's rules; an error when they are not exactly one event
/// decode_event_batch would keep.
expected<kv_event> decode_one_event(const uint8_t* data, size_t size);

/// The batch holds an AllBlocksCleared (a pass-through batch's own events
/// are read from its record: only those that are not a BlockStored are
/// decoded, and they are a few bytes each).
bool clears_all_blocks(const kv_event_batch& batch);

/// The layout of the batch's BlockStored events, as the engine wrote them
/// (kv_event_batch::stored_layout, or the pass-through check's for a batch
/// left as bytes); none when the batch has no BlockStored (either fits).
/// What a rank's snapshot batches should carry to come out as its engine's
/// own bytes.
std::optional<vllm_stored_layout> stored_layout_of(const kv_event_batch& batch);

/// Turns a pass-through batch (kv_event_batch::wire, events left as bytes)
/// into an ordinary one: decodes its events and drops `wire`. dp_rank and ts
/// keep their values. No-op for a batch without `wire`.
void decode_wire_events(kv_event_batch& batch);

/// Appends `data` (canonical, as `c` describes it) with its dp_rank replaced:
/// the same bytes as encode_event_batch(decode_event_batch(data) with
/// dp_rank set to `dp_rank`).
void encode_canonical_with_rank(const uint8_t* data, const canonical_batch& c,
                                std::optional<int64_t> dp_rank, std::string& out);

} // namespace kvs
