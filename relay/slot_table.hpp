// slot_table: the block index's hash table, from a block's key to the index
// of the slot that holds it.
//
// Open addressing with linear probing over one flat array: an entry is the
// slot index and 32 bits of the key's hash, so a probe compares 8 bytes here
// and touches the slot (where the key itself lives) only when those match.
// std::unordered_map cost a node allocation per block, a pointer chase and
// an integer division per lookup (its prime bucket count); this is a mask.
// Power-of-two size, at most half full; erase shifts the following entries
// back (no tombstones), so an index that stores and removes for months
// never slows down.
//
// The hash must mix well: an engine (or an attacker) choosing block hashes
// must not be able to pile them into one run of buckets, so block_index
// hashes keys with a seed drawn per process (key_hash in block_index.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvs {

class slot_table {
public:
  static constexpr uint32_t none = ~uint32_t{0};

  size_t size() const { return size_; }
  /// Bytes of the table itself.
  size_t memory_bytes() const { return entries_.capacity() * sizeof(entry); }

  /// The slot whose key `matches` (called with a candidate slot index), among
  /// the entries of hash `h`; none when absent.
  template <typename Matches>
  uint32_t find(uint64_t h, Matches&& matches) const {
    if (entries_.empty())
      return none;
    const auto tag = static_cast<uint32_t>(h);
    for (size_t b = tag & mask_;; b = (b + 1) & mask_) {
      const entry& e = entries_[b];
      if (e.slot == none)
        return none;
      if (e.tag == tag && matches(e.slot))
        return e.slot;
    }
  }

  /// Adds `slot` under hash `h`. Precondition: its key is not in the table.
  void insert(uint64_t h, uint32_t slot) {
    if (2 * (size_ + 1) > entries_.size())
      grow();
    place(entry{slot, static_cast<uint32_t>(h)});
    ++size_;
  }

  /// Removes `slot` (present, under hash `h`).
  void erase(uint64_t h, uint32_t slot) {
    size_t b = static_cast<uint32_t>(h) & mask_;
    while (entries_[b].slot != slot)
      b = (b + 1) & mask_;
    // Backward shift: move up every following entry of the run that may sit
    // at the freed bucket (its home is not between the hole and itself).
    for (size_t next = (b + 1) & mask_;; next = (next + 1) & mask_) {
      const entry& e = entries_[next];
      if (e.slot == none)
        break;
      const size_t home = e.tag & mask_;
      if (((next - home) & mask_) >= ((next - b) & mask_)) {
        entries_[b] = e;
        b = next;
      }
    }
    entries_[b] = entry{};
    --size_;
  }

  void clear() {
    entries_.clear();
    entries_.shrink_to_fit();
    mask_ = 0;
    size_ = 0;
  }

private:
  struct entry {
    uint32_t slot = none;
    uint32_t tag = 0; ///< the hash's low 32 bits: its home bucket, and a filter
  };

  void place(entry in) {
    size_t b = in.tag & mask_;
    while (entries_[b].slot != none)
      b = (b + 1) & mask_;
    entries_[b] = in;
  }

  void grow() {
    std::vector<entry> old;
    old.swap(entries_);
    entries_.assign(old.empty() ? 16 : 2 * old.size(), entry{});
    mask_ = entries_.size() - 1;
    for (const entry& e : old)
      if (e.slot != none)
        place(e);
  }

  std::vector<entry> entries_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

} // namespace kvs
