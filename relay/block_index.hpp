// block_index: the blocks one DP rank holds now, rebuilt from the events it
// publishes, and the consistent snapshots served to late routers.
//
// Pure single-threaded data structure (no CAF, no ZeroMQ), owned by the
// rank's indexer (actors/relay/indexer.hpp), which applies the published batches
// in seq order. A block is keyed by (hash, medium, group_idx), the way vLLM
// keys its events: the same hash may be held on "GPU" and on "CPU" at once,
// and a BlockRemoved names hashes of one medium (and KV-cache group).
//
// Per block it keeps the hash, the parent hash, its own token ids, its own
// element of `extra_keys` (vLLM sends one per block) and a shared pointer to
// the rest of the BlockStored event it came in (block_size, lora, medium,
// group, kv_cache_spec_*, locality, ownership, ... : every other field of
// kv_events.hpp's block_stored, so fields added there later are carried
// without changes here).
//
// Snapshots without stalling live publishing: begin_snapshot() records a
// stamp (O(1)); snapshot_next() then yields the blocks that existed at that
// stamp a few at a time, between live batches. Live mutations during a
// snapshot first save the pre-image of every block they change or remove
// that the snapshot has not yielded yet (copy-on-write per block), so the
// snapshot is exactly the state at begin_snapshot(). Blocks come parents
// first (a block's ancestors in the index are yielded before it).
#pragma once

#include "relay/slot_table.hpp"
#include "events_wire/kv_events.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

class block_index {
public:
  /// At most `max_blocks` blocks; stores past that are refused and counted.
  explicit block_index(size_t max_blocks);

  void apply(const kv_event& ev);
  /// Every event of a published batch, in order; a pass-through batch from
  /// what the ingest bridge's check recorded of it (kv_events.hpp
  /// canonical_events), decoding only what that cannot give.
  void apply(const kv_event_batch& batch);
  /// A BlockStored given by its per-block fields only (what the pass-through
  /// check recorded: canonical_event), its other fields being those of the
  /// BlockStored applied just before: the medium, group and shared
  /// attributes derived for that one are reused, not compared again. False,
  /// and nothing applied, when there are none (then apply the decoded event).
  bool apply_stored(const uint64_t* hashes, size_t n, std::optional<uint64_t> parent,
                    const int32_t* tokens, size_t token_count);

  size_t size() const {
    return table_.size();
  }
  size_t max_blocks() const {
    return max_blocks_;
  }
  /// Blocks not indexed because the index was full (or a 65th medium).
  uint64_t refused() const {
    return refused_;
  }
  /// Events of pass-through batches decoded from their bytes (the others
  /// went in from the ingest bridge's record).
  uint64_t decoded_events() const {
    return decoded_events_;
  }
  /// Bytes the index holds: slots, hash table, per-block token ids and
  /// extra keys, shared per-event attributes and pending snapshot pre-images.
  size_t memory_bytes() const;

  // -- snapshots --------------------------------------------------------------

  bool snapshot_active() const {
    return snap_active_;
  }
  /// Starts a snapshot of the current state. Precondition: none active.
  void begin_snapshot();
  /// Appends BlockStored events carrying at most `max_blocks` blocks of the
  /// active snapshot to `out`. Returns true once the snapshot is complete
  /// (everything yielded; the snapshot is then no longer active).
  bool snapshot_next(size_t max_blocks, std::vector<kv_event>& out);
  /// Abandons the active snapshot (its client left).
  void cancel_snapshot();
  /// Blocks whose pre-image was saved because a live event changed them
  /// during a snapshot (since start).
  uint64_t preimages() const {
    return preimages_;
  }

private:
  static constexpr uint32_t none = ~uint32_t{0};
  static constexpr int64_t no_group = INT64_MIN;

  struct key {
    uint64_t hash;
    int64_t group;
    uint16_t medium;
    bool operator==(const key& o) const {
      return hash == o.hash && group == o.group && medium == o.medium;
    }
  };
  /// The key's hash for slot_table: fmix64 (MurmurHash3's finaliser) of
  /// its fields and a per-process seed, so that no engine, however it picks
  /// its block hashes, can crowd them into one run of buckets.
  uint64_t hash_of(const key& k) const {
    uint64_t x = k.hash ^ seed_ ^ (static_cast<uint64_t>(k.group) * 0x9e3779b97f4a7c15ULL)
                 ^ (uint64_t{k.medium} << 56);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }
  /// The slot holding `k` (of hash h), or none.
  uint32_t find(const key& k, uint64_t h) const {
    return table_.find(h, [&](uint32_t s) { return slots_[s].k == k; });
  }
  /// One block's token ids, 4 bytes each when they all fit (they do for
  /// every vocabulary), else 8: the index's largest per-block cost.
  class packed_tokens {
  public:
    packed_tokens() = default;
    packed_tokens(const packed_tokens& o) {
      *this = o;
    }
    packed_tokens& operator=(const packed_tokens& o);
    packed_tokens(packed_tokens&&) = default;
    packed_tokens& operator=(packed_tokens&&) = default;

    void assign(const int64_t* first, const int64_t* last);
    void assign(const int32_t* first, const int32_t* last);
    size_t size() const {
      return n_;
    }
    void append_to(std::vector<int64_t>& out) const;
    size_t heap_bytes() const {
      return data_ ? words() * sizeof(int32_t) : 0;
    }

  private:
    size_t words() const {
      return wide_ ? 2 * size_t{n_} : n_;
    }
    /// Room for n narrow tokens (n_ = n, not wide).
    void narrow_buffer(uint32_t n);
    std::unique_ptr<int32_t[]> data_;
    uint32_t n_ = 0;
    bool wide_ = false;

  public:
    bool has_parent = false; ///< of the block_data holding it (fills the padding)
  };
  /// A block's data, as a snapshot yields it.
  struct block_data {
    uint64_t hash = 0;
    uint64_t parent = 0; ///< when tokens.has_parent
    packed_tokens tokens;
    std::shared_ptr<const block_stored> attrs;     ///< the event's other fields
    std::shared_ptr<const std::string> extra_key; ///< its extra_keys element (msgpack)
    /// Its lookahead_token_ids entry (vLLM 0.33: one list per block).
    std::shared_ptr<const std::vector<int64_t>> lookahead;
  };
  struct record {
    block_data data;
    key k{};
    uint64_t stamp = 0;       ///< clock when stored
    uint64_t emitted = 0;     ///< snapshot id that already holds this block
    uint32_t prev = none;     ///< insertion order (snapshot walk)
    uint32_t next = none;
  };

  void store(const block_stored& ev);
  /// The blocks of one BlockStored, with prepared_'s attributes.
  template <typename Token>
  void store_blocks(const uint64_t* hashes, size_t n, std::optional<uint64_t> parent,
                    const Token* tokens, size_t token_count);
  /// Fills prepared_ for `ev`; false when its medium is refused.
  bool prepare(const block_stored& ev);
  /// The event's fields other than the per-block ones, shared by every block
  /// it stored: the previous event's object when they are all equal (the
  /// usual case: one medium, one group, one spec), else a new one.
  std::shared_ptr<const block_stored> attrs_of(const block_stored& ev, bool split_extras,
                                               bool split_lookahead);
  void remove(const block_removed& ev);
  void clear();
  std::optional<uint16_t> medium_id(const std::optional<std::string>& m, bool add);
  uint32_t alloc_slot();
  void unlink(uint32_t i);
  void free_slot(uint32_t i);
  /// True when the active snapshot still has to yield slot i.
  bool owed(uint32_t i) const;
  /// Saves slot i (and its owed ancestors, first) for the active snapshot:
  /// a copy when a live event is about to change it (`copy`), else a
  /// reference that snapshot_next() uses before it returns.
  void save_preimage(uint32_t i, bool copy = true);
  const block_data& pending_at(size_t i) const {
    return pending_[i].slot != none ? slots_[pending_[i].slot].data : pending_[i].data;
  }
  size_t record_bytes(const record& r) const;

  size_t max_blocks_;
  uint64_t seed_ = 0; ///< hash_of()'s, drawn per index
  slot_table table_; ///< key -> slot index
  std::vector<record> slots_;
  std::vector<uint32_t> free_;
  uint32_t head_ = none, tail_ = none;
  std::vector<std::optional<std::string>> mediums_;
  uint64_t clock_ = 0;
  uint64_t refused_ = 0;
  size_t heap_bytes_ = 0; ///< tokens and extra keys of live records
  std::shared_ptr<size_t> attr_bytes_ = std::make_shared<size_t>(0);
  std::weak_ptr<const block_stored> last_attrs_; ///< attrs_of()'s last answer
  std::shared_ptr<const std::string> last_extra_key_; ///< reused for equal elements
  std::vector<std::string> extras_; ///< prepare()'s split extra_keys (kept: no allocation)
  /// What store() derived from the last BlockStored's fields other than the
  /// per-block ones, reused by apply_stored() for the next one.
  struct prepared_event {
    bool valid = false;
    size_t blocks = 0; ///< its block count (extra_keys and lookahead split by it)
    uint16_t medium = 0;
    int64_t group = no_group;
    size_t block_size = 0;
    std::shared_ptr<const block_stored> attrs;
    std::vector<std::shared_ptr<const std::string>> extra_keys; ///< per block, or none
    std::vector<std::shared_ptr<const std::vector<int64_t>>> lookahead; ///< per block, or none
  } prepared_;
  /// The bytes after token_ids of the pass-through BlockStored prepared_
  /// was derived from (and its dialect): a later batch's first BlockStored
  /// with the same bytes there reuses prepared_ instead of being decoded.
  struct prepared_tail {
    bool valid = false;
    event_dialect dialect = event_dialect::vllm;
    std::string bytes;
  } prepared_tail_;
  uint64_t decoded_events_ = 0;

  // snapshot
  bool snap_active_ = false;
  uint64_t snap_id_ = 0;
  uint64_t snap_stamp_ = 0;
  uint32_t cursor_ = none;
  struct pending_entry {
    uint32_t slot = none; ///< a live slot's data (within snapshot_next only)
    block_data data;      ///< else a saved copy
  };
  std::vector<pending_entry> pending_;
  size_t pending_pos_ = 0;
  std::vector<uint32_t> chain_;
  uint64_t preimages_ = 0;
};

} // namespace kvs
