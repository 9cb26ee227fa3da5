#include "relay/block_index.hpp"

#include "events_wire/kv_event_codec.hpp"
#include "msgpack/msgpack_split.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

namespace kvs {

namespace {

constexpr size_t max_mediums = 64;
const std::shared_ptr<const std::string> no_extra_key;
const std::shared_ptr<const std::vector<int64_t>> no_lookahead;

/// Whether `a` (attributes already shared) holds exactly the attributes
/// `ev` would get: every field but the per-block ones. The static_assert
/// below fails when a field is added to block_stored: add it here too.
bool same_attrs(const block_stored& a, const block_stored& ev, bool split_extras,
                bool split_lookahead) {
  return a.block_size == ev.block_size && a.lora_id == ev.lora_id && a.medium == ev.medium
         && a.lora_name == ev.lora_name
         && (split_extras ? !a.extra_keys_msgpack : a.extra_keys_msgpack == ev.extra_keys_msgpack)
         && a.group_idx == ev.group_idx && a.kv_cache_spec_kind == ev.kv_cache_spec_kind
         && a.kv_cache_spec_sliding_window == ev.kv_cache_spec_sliding_window
         && a.locality == ev.locality && a.ownership == ev.ownership
         && a.session_id == ev.session_id
         && (split_lookahead ? !a.lookahead_token_ids
                             : a.lookahead_token_ids == ev.lookahead_token_ids)
         && a.cache_salt == ev.cache_salt;
}
// 472 bytes with libstdc++ on 64-bit Linux (the platforms built); a new field
// changes it and stops the build here until same_attrs() compares it.
static_assert(sizeof(void*) != 8 || sizeof(block_stored) == 472,
              "block_stored changed: compare the new field in same_attrs()");

size_t attrs_bytes(const block_stored& a) {
  auto str = [](const std::optional<std::string>& s) { return s ? s->capacity() : 0; };
  return sizeof(block_stored) + 16 /* control block */ + str(a.medium) + str(a.lora_name)
         + str(a.extra_keys_msgpack) + str(a.kv_cache_spec_kind) + str(a.locality)
         + str(a.ownership) + str(a.session_id);
}

} // namespace

block_index::packed_tokens& block_index::packed_tokens::operator=(const packed_tokens& o) {
  if (this == &o)
    return *this;
  n_ = o.n_;
  wide_ = o.wide_;
  has_parent = o.has_parent;
  data_.reset();
  if (o.data_) {
    data_.reset(new int32_t[o.words()]);
    std::memcpy(data_.get(), o.data_.get(), o.words() * sizeof(int32_t));
  }
  return *this;
}

void block_index::packed_tokens::narrow_buffer(uint32_t n) {
  // A block stored again (or a slot reused) usually has as many tokens:
  // its buffer is kept.
  if (!data_ || wide_ || n != n_)
    data_.reset(n ? new int32_t[n] : nullptr);
  n_ = n;
  wide_ = false;
}

void block_index::packed_tokens::assign(const int64_t* first, const int64_t* last) {
  const auto n = static_cast<uint32_t>(last - first);
  // Narrowed in the same pass that checks the range (token ids fit int32
  // for every vocabulary); stored wide only when one does not.
  narrow_buffer(n);
  bool fits = true;
  for (uint32_t i = 0; i < n; ++i) {
    fits &= first[i] >= std::numeric_limits<int32_t>::min()
            && first[i] <= std::numeric_limits<int32_t>::max();
    data_[i] = static_cast<int32_t>(first[i]);
  }
  if (fits)
    return;
  wide_ = true;
  data_.reset(new int32_t[words()]);
  std::memcpy(data_.get(), first, n_ * sizeof(int64_t));
}

void block_index::packed_tokens::assign(const int32_t* first, const int32_t* last) {
  const auto n = static_cast<uint32_t>(last - first);
  narrow_buffer(n);
  if (n)
    std::memcpy(data_.get(), first, n * sizeof(int32_t));
}

void block_index::packed_tokens::append_to(std::vector<int64_t>& out) const {
  auto at = out.size();
  out.resize(at + n_);
  if (wide_)
    std::memcpy(out.data() + at, data_.get(), n_ * sizeof(int64_t));
  else
    for (uint32_t i = 0; i < n_; ++i)
      out[at + i] = data_[i];
}

block_index::block_index(size_t max_blocks) : max_blocks_(max_blocks) {
  std::random_device seed;
  seed_ = (uint64_t{seed()} << 32) | seed();
}

void block_index::apply(const kv_event& ev) {
  prepared_tail_.valid = false; // prepared_ is this event's now (if any)
  if (auto s = std::get_if<block_stored>(&ev)) {
    store(*s);
    return;
  }
  prepared_.valid = false; // apply_stored() reuses only a BlockStored just before
  if (auto r = std::get_if<block_removed>(&ev))
    remove(*r);
  else
    clear();
}

std::shared_ptr<const block_stored> block_index::attrs_of(const block_stored& ev,
                                                          bool split_extras,
                                                          bool split_lookahead) {
  if (auto last = last_attrs_.lock(); last && same_attrs(*last, ev, split_extras, split_lookahead))
    return last;
  // A copy without the per-block fields (attributes change rarely, so
  // copying the tokens to drop them costs nothing that matters).
  auto shared = new block_stored{ev};
  shared->block_hashes = {};
  shared->parent_block_hash.reset();
  shared->token_ids = {};
  if (split_extras)
    shared->extra_keys_msgpack.reset();
  if (split_lookahead)
    shared->lookahead_token_ids.reset();
  auto cost = attrs_bytes(*shared);
  *attr_bytes_ += cost;
  std::shared_ptr<const block_stored> attrs(shared,
                                            [counter = attr_bytes_, cost](const block_stored* p) {
                                              *counter -= cost;
                                              delete p;
                                            });
  last_attrs_ = attrs;
  return attrs;
}

std::optional<uint16_t> block_index::medium_id(const std::optional<std::string>& m, bool add) {
  for (size_t i = 0; i < mediums_.size(); ++i)
    if (mediums_[i] == m)
      return static_cast<uint16_t>(i);
  if (!add || mediums_.size() >= max_mediums)
    return std::nullopt;
  mediums_.push_back(m);
  return static_cast<uint16_t>(mediums_.size() - 1);
}

uint32_t block_index::alloc_slot() {
  uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  auto& r = slots_[i];
  r.prev = tail_;
  r.next = none;
  if (tail_ != none)
    slots_[tail_].next = i;
  else
    head_ = i;
  tail_ = i;
  return i;
}

void block_index::unlink(uint32_t i) {
  auto& r = slots_[i];
  if (cursor_ == i)
    cursor_ = r.next;
  (r.prev != none ? slots_[r.prev].next : head_) = r.next;
  (r.next != none ? slots_[r.next].prev : tail_) = r.prev;
}

void block_index::free_slot(uint32_t i) {
  unlink(i);
  heap_bytes_ -= record_bytes(slots_[i]);
  slots_[i] = record{};
  free_.push_back(i);
}

size_t block_index::record_bytes(const record& r) const {
  // A shared extra key is charged to each block that holds it (an upper
  // bound); 16 bytes per allocation is glibc's overhead.
  return r.data.tokens.heap_bytes() + 16
         + (r.data.extra_key ? r.data.extra_key->capacity() + sizeof(std::string) + 32 : 0)
         + (r.data.lookahead ? r.data.lookahead->capacity() * sizeof(int64_t) + 48 : 0);
}

bool block_index::owed(uint32_t i) const {
  const auto& r = slots_[i];
  return snap_active_ && r.stamp <= snap_stamp_ && r.emitted != snap_id_;
}

void block_index::save_preimage(uint32_t i, bool copy) {
  // Walk up to the first ancestor the snapshot already has (or that is not
  // indexed), then save top-down: parents before children. Marking while
  // walking also ends a (malformed) cycle of parents.
  chain_.clear();
  for (uint32_t cur = i;;) {
    auto& r = slots_[cur];
    r.emitted = snap_id_;
    chain_.push_back(cur);
    if (!r.data.tokens.has_parent)
      break;
    const key pk{r.data.parent, r.k.group, r.k.medium};
    // Chains come in order: the block saved just before is usually the
    // parent, already in the snapshot; no hash lookup then.
    if (cur == i && !pending_.empty() && pending_.back().slot != none
        && slots_[pending_.back().slot].k == pk)
      break;
    const uint32_t at = find(pk, hash_of(pk));
    if (at == none || !owed(at))
      break;
    cur = at;
  }
  for (auto it = chain_.rbegin(); it != chain_.rend(); ++it)
    if (copy)
      pending_.push_back(pending_entry{none, slots_[*it].data});
    else
      pending_.push_back(pending_entry{*it, {}});
  preimages_ += chain_.size();
}

bool block_index::prepare(const block_stored& ev) {
  auto& pa = prepared_;
  pa.valid = false;
  const size_t n = ev.block_hashes.size();
  auto med = medium_id(ev.medium, true);
  if (!med)
    return false;
  pa.medium = *med;
  pa.group = ev.group_idx ? *ev.group_idx : no_group;
  pa.block_size = ev.block_size > 0 ? static_cast<size_t>(ev.block_size) : 0;
  // Per-block parts: token ids by block_size, extra_keys by element,
  // lookahead_token_ids by element (one list per block hash); the event's
  // other fields become the shared attributes.
  const bool split_extras =
    ev.extra_keys_msgpack && msgpack_io::split_array(*ev.extra_keys_msgpack, n, extras_);
  const bool split_lookahead = ev.lookahead_token_ids && ev.lookahead_token_ids->size() == n;
  pa.attrs = attrs_of(ev, split_extras, split_lookahead);
  pa.extra_keys.clear();
  if (split_extras)
    for (size_t b = 0; b < n; ++b) {
      // Most engines send the same element for every block ([None]): one
      // shared string then, not one per block.
      if (!last_extra_key_ || *last_extra_key_ != extras_[b])
        last_extra_key_ = std::make_shared<const std::string>(std::move(extras_[b]));
      pa.extra_keys.push_back(last_extra_key_);
    }
  pa.lookahead.clear();
  if (split_lookahead)
    for (const auto& l : *ev.lookahead_token_ids)
      pa.lookahead.push_back(std::make_shared<const std::vector<int64_t>>(l));
  pa.blocks = n;
  pa.valid = true;
  return true;
}

void block_index::store(const block_stored& ev) {
  const size_t n = ev.block_hashes.size();
  if (n == 0) {
    prepared_.valid = false;
    return;
  }
  if (!prepare(ev)) {
    refused_ += n;
    return;
  }
  store_blocks(ev.block_hashes.data(), n, ev.parent_block_hash, ev.token_ids.data(),
               ev.token_ids.size());
}

void block_index::apply(const kv_event_batch& batch) {
  if (!batch.wire) {
    for (const auto& ev : batch.events)
      apply(ev);
    return;
  }
  // A pass-through batch arrives undecoded (the live path never paid for a
  // decode). Its BlockStored events go in from what the ingest bridge's
  // check recorded (hashes, parent, int32 tokens) whenever their other
  // fields are the previous event's; any other event is decoded from its own
  // bytes. A canonical payload always decodes.
  const auto* bytes = reinterpret_cast<const uint8_t*>(batch.wire->bytes->data());
  if (!batch.wire->events) { // not recorded (the ingest bridge always does)
    if (auto decoded = decode_event_batch(bytes, batch.wire->bytes->size()))
      for (const auto& ev : decoded->batch.events)
        apply(ev);
    return;
  }
  const canonical_record& rec = *batch.wire->events;
  const auto dialect = batch.wire->dialect;
  for (const auto& ev : rec.events) {
    // Reusable: the tail of the event before it in this batch (the check
    // compared), or, for a batch's first, of the one prepared_ came from.
    const auto tail = [&] {
      return std::string_view{reinterpret_cast<const char*>(bytes) + ev.tail_at,
                              ev.at + ev.size - ev.tail_at};
    };
    const bool same = ev.same_tail || (prepared_tail_.valid && prepared_tail_.dialect == dialect
                                       && ev.stored && tail() == prepared_tail_.bytes);
    if (ev.stored && same && ev.narrow &&
        apply_stored(rec.hashes.data() + ev.hashes_at, ev.hashes,
                     ev.has_parent ? std::optional<uint64_t>{ev.parent} : std::nullopt,
                     rec.tokens.data() + ev.tokens_at, ev.tokens))
      continue;
    ++decoded_events_;
    if (auto one = decode_one_event(bytes + ev.at, ev.size)) {
      apply(*one);
      if (ev.stored && prepared_.valid) {
        prepared_tail_.valid = true;
        prepared_tail_.dialect = dialect;
        prepared_tail_.bytes.assign(tail());
      }
    } else {
      prepared_.valid = false; // never for a canonical payload; nothing to reuse after it
    }
  }
}

bool block_index::apply_stored(const uint64_t* hashes, size_t n, std::optional<uint64_t> parent,
                               const int32_t* tokens, size_t token_count) {
  if (n == 0 || !prepared_.valid || prepared_.blocks != n)
    return false;
  store_blocks(hashes, n, parent, tokens, token_count);
  return true;
}

template <typename Token>
void block_index::store_blocks(const uint64_t* hashes, size_t n, std::optional<uint64_t> parent,
                               const Token* toks, size_t token_count) {
  const auto& pa = prepared_;
  const size_t bs = pa.block_size;
  for (size_t b = 0; b < n; ++b) {
    key k{hashes[b], pa.group, pa.medium};
    // Block b's token ids: [b*bs, (b+1)*bs), the last block takes the rest.
    size_t lo = std::min(token_count, b * bs);
    size_t hi = b + 1 == n ? token_count : std::min(token_count, (b + 1) * bs);
    const uint64_t h = hash_of(k);
    uint32_t i = find(k, h);
    if (i != none) {
      if (owed(i))
        save_preimage(i);
      heap_bytes_ -= record_bytes(slots_[i]);
    } else {
      if (table_.size() >= max_blocks_) {
        ++refused_;
        parent = k.hash;
        continue;
      }
      i = alloc_slot();
      table_.insert(h, i);
    }
    auto& r = slots_[i];
    r.k = k;
    r.stamp = ++clock_;
    r.data.hash = k.hash;
    // Shared pointers are assigned only when they change: a block stored
    // again keeps them, and each assignment is two atomic operations.
    if (r.data.attrs != pa.attrs)
      r.data.attrs = pa.attrs;
    r.data.tokens.assign(toks + lo, toks + hi);
    r.data.tokens.has_parent = parent.has_value();
    r.data.parent = parent.value_or(0);
    const auto& extra_key = pa.extra_keys.empty() ? no_extra_key : pa.extra_keys[b];
    if (r.data.extra_key != extra_key)
      r.data.extra_key = extra_key;
    const auto& lookahead = pa.lookahead.empty() ? no_lookahead : pa.lookahead[b];
    if (r.data.lookahead != lookahead)
      r.data.lookahead = lookahead;
    heap_bytes_ += record_bytes(r);
    parent = k.hash;
  }
}

void block_index::remove(const block_removed& ev) {
  auto med = medium_id(ev.medium, false);
  if (!med)
    return;
  const int64_t group = ev.group_idx ? *ev.group_idx : no_group;
  for (auto h : ev.block_hashes) {
    const key k{h, group, *med};
    const uint64_t kh = hash_of(k);
    const uint32_t i = find(k, kh);
    if (i == none)
      continue;
    if (owed(i))
      save_preimage(i);
    table_.erase(kh, i);
    ++clock_;
    free_slot(i);
  }
}

void block_index::clear() {
  // A snapshot in progress still owes the blocks it has not yielded: save
  // them all now (rare: engine restart or reset_prefix_cache).
  if (snap_active_)
    for (auto i = cursor_; i != none; i = slots_[i].next)
      if (owed(i))
        save_preimage(i);
  cursor_ = none;
  table_.clear();
  slots_.clear();
  free_.clear();
  head_ = tail_ = none;
  heap_bytes_ = 0;
  ++clock_;
}

size_t block_index::memory_bytes() const {
  size_t pending = 0;
  for (size_t i = pending_pos_; i < pending_.size(); ++i)
    pending += sizeof(pending_entry) + pending_[i].data.tokens.heap_bytes();
  return slots_.capacity() * sizeof(record) + free_.capacity() * sizeof(uint32_t)
         + table_.memory_bytes() + heap_bytes_
         + *attr_bytes_ + pending;
}

void block_index::begin_snapshot() {
  snap_active_ = true;
  ++snap_id_;
  snap_stamp_ = clock_;
  cursor_ = head_;
  pending_.clear();
  pending_pos_ = 0;
}

void block_index::cancel_snapshot() {
  snap_active_ = false;
  cursor_ = none;
  pending_.clear();
  pending_.shrink_to_fit();
  pending_pos_ = 0;
}

bool block_index::snapshot_next(size_t max_blocks, std::vector<kv_event>& out) {
  if (!snap_active_)
    return true;
  max_blocks = std::max<size_t>(max_blocks, 1);
  // Fill pending_ up to the budget: saved pre-images first, then the walk.
  while (pending_.size() - pending_pos_ < max_blocks && cursor_ != none) {
    auto i = cursor_;
    cursor_ = slots_[i].next;
    if (owed(i))
      save_preimage(i, false);
  }
  size_t end = std::min(pending_.size(), pending_pos_ + max_blocks);
  // A chain cut at `end` continues in the next call, its parent hash intact.
  for (size_t i = pending_pos_; i < end;) {
    const auto& first = pending_at(i);
    block_stored ev = *first.attrs;
    if (first.tokens.has_parent)
      ev.parent_block_hash = first.parent;
    else
      ev.parent_block_hash.reset();
    const bool split_keys = first.extra_key != nullptr;
    const bool split_look = first.lookahead != nullptr;
    std::string keys;
    size_t j = i;
    for (; j < end; ++j) {
      const auto& b = pending_at(j);
      if (j > i) {
        const auto& prev = pending_at(j - 1);
        // Merge a chain of one event: same attributes, parent = previous,
        // every block but the last exactly block_size tokens.
        if (b.attrs != first.attrs || !b.tokens.has_parent || b.parent != prev.hash
            || (b.extra_key != nullptr) != split_keys
            || (b.lookahead != nullptr) != split_look || ev.block_size <= 0
            || prev.tokens.size() != static_cast<size_t>(ev.block_size))
          break;
      }
      ev.block_hashes.push_back(b.hash);
      b.tokens.append_to(ev.token_ids);
      if (split_keys)
        keys += *b.extra_key;
      if (split_look) {
        if (!ev.lookahead_token_ids)
          ev.lookahead_token_ids.emplace();
        ev.lookahead_token_ids->push_back(*b.lookahead);
      }
    }
    if (split_keys) {
      std::string v;
      msgpack_io::append_array_header(v, j - i);
      v += keys;
      ev.extra_keys_msgpack = std::move(v);
    }
    out.emplace_back(std::move(ev));
    i = j;
  }
  pending_pos_ = end;
  // What stays pending may change before the next call: copy it now.
  for (size_t i = pending_pos_; i < pending_.size(); ++i)
    if (pending_[i].slot != none) {
      pending_[i].data = slots_[pending_[i].slot].data;
      pending_[i].slot = none;
    }
  // Live pre-images keep arriving: drop what was yielded once it is most of
  // the buffer, so pending_ never holds more than the blocks still owed.
  if (pending_pos_ == pending_.size()) {
    pending_.clear();
    pending_pos_ = 0;
  } else if (pending_pos_ >= 4096 && 2 * pending_pos_ >= pending_.size()) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pending_pos_));
    pending_pos_ = 0;
  }
  if (cursor_ == none && pending_.empty()) {
    snap_active_ = false;
    return true;
  }
  return false;
}

} // namespace kvs
