// Random KV event batches for the codec tests: every field, every msgpack
// width, both signs; and runs of BlockStored events that share everything
// after token_ids, like an engine's (what the decoder's and the pass-through
// check's per-event memo recognise).
#pragma once

#include "events_wire/kv_events.hpp"

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <variant>

namespace kvs_test {

using namespace kvs;


struct rng {
  std::mt19937_64 g{20261201};
  uint64_t u() { return g(); }
  bool coin() { return u() & 1; }
  uint64_t below(uint64_t n) { return u() % n; }
  /// Values across every msgpack width, both signs.
  int64_t any_int() {
    static const int64_t edges[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295LL,
                                    4294967296LL, -1, -32, -33, -128, -129, -32768, -32769,
                                    -2147483648LL, -2147483649LL, INT64_MAX, INT64_MIN};
    if (coin())
      return edges[below(sizeof edges / sizeof edges[0])];
    return static_cast<int64_t>(u()) >> below(64);
  }
  uint64_t any_hash() { return coin() ? u() : u() >> below(64); }
  std::string any_str() {
    static const char* strs[] = {"", "GPU", "sliding_window", "s\xc3\xa9ssion",
                                 "0123456789012345678901234567890123456789"};
    if (below(8) == 0)
      return std::string(300 + below(100), 'x');
    return strs[below(5)];
  }
  template <typename T, typename F>
  std::optional<T> maybe(F f) {
    if (coin())
      return f();
    return std::nullopt;
  }
};

inline kv_event random_event(rng& r) {
  switch (r.below(3)) {
    case 0: {
      block_stored s;
      for (uint64_t k = r.below(20); k > 0; --k)
        s.block_hashes.push_back(r.any_hash());
      s.parent_block_hash = r.maybe<uint64_t>([&] { return r.any_hash(); });
      for (uint64_t k = r.below(40); k > 0; --k)
        s.token_ids.push_back(r.any_int());
      s.block_size = static_cast<int64_t>(r.below(1u << 20));
      s.lora_id = r.maybe<int64_t>([&] { return r.any_int(); });
      s.medium = r.maybe<std::string>([&] { return r.any_str(); });
      s.lora_name = r.maybe<std::string>([&] { return r.any_str(); });
      if (r.coin())
        s.extra_keys_msgpack = std::string("\x92\xc0\x92\xa1x\x05", 6);
      s.group_idx = r.maybe<int64_t>([&] { return r.any_int(); });
      s.kv_cache_spec_kind = r.maybe<std::string>([&] { return r.any_str(); });
      s.kv_cache_spec_sliding_window = r.maybe<int64_t>([&] { return r.any_int(); });
      s.locality = r.maybe<std::string>([&] { return r.any_str(); });
      s.ownership = r.maybe<std::string>([&] { return r.any_str(); });
      s.session_id = r.maybe<std::string>([&] { return r.any_str(); });
      if (r.coin()) {
        s.lookahead_token_ids.emplace();
        for (uint64_t k = r.below(4); k > 0; --k)
          s.lookahead_token_ids->push_back({r.any_int(), r.any_int()});
      }
      if (r.below(4) == 0)
        s.cache_salt = "tenant";
      return s;
    }
    case 1: {
      block_removed e;
      for (uint64_t k = r.below(20); k > 0; --k)
        e.block_hashes.push_back(r.any_hash());
      e.medium = r.maybe<std::string>([&] { return r.any_str(); });
      e.group_idx = r.maybe<int64_t>([&] { return r.any_int(); });
      e.locality = r.maybe<std::string>([&] { return r.any_str(); });
      e.ownership = r.maybe<std::string>([&] { return r.any_str(); });
      return e;
    }
    default: return all_blocks_cleared{};
  }
}

/// Gives `s` the fields after token_ids (its "tail") of `from`, the way an
/// engine's consecutive BlockStored events share block_size, medium,
/// extra_keys and the rest; then, one time in three, changes one of them.
inline void share_tail(block_stored& s, const block_stored& from, rng& r) {
  auto hashes = std::move(s.block_hashes);
  auto parent = s.parent_block_hash;
  auto tokens = std::move(s.token_ids);
  s = from;
  s.block_hashes = std::move(hashes);
  s.parent_block_hash = parent;
  s.token_ids = std::move(tokens);
  if (r.below(3) != 0)
    return;
  switch (r.below(6)) {
    case 0: s.block_size += 1; break;
    case 1: s.medium = r.maybe<std::string>([&] { return r.any_str(); }); break;
    case 2: s.locality = r.maybe<std::string>([&] { return r.any_str(); }); break;
    case 3: s.extra_keys_msgpack = std::string("\x91\xc0", 2); break;
    case 4: s.lookahead_token_ids.reset(); break;
    default: s.session_id = std::string("other"); break;
  }
}

/// Random events; half the time a BlockStored shares the previous one's
/// tail (see share_tail), as every engine's batches do.
inline kv_event_batch random_batch(rng& r) {
  kv_event_batch b;
  b.ts = static_cast<double>(r.any_int()) / 3.0;
  const bool runs = r.coin();
  for (uint64_t k = r.below(r.coin() ? 5 : 40); k > 0; --k)
    b.events.push_back(random_event(r));
  const block_stored* last = nullptr;
  for (auto& ev : b.events)
    if (auto* s = std::get_if<block_stored>(&ev)) {
      if (runs && last && r.below(4) != 0)
        share_tail(*s, *last, r);
      last = s;
    }
  b.dp_rank = r.maybe<int64_t>([&] { return r.any_int(); });
  return b;
}


/// `s` without its per-block head (hashes, parent, tokens): its "tail".
inline block_stored tail_of(const block_stored& s) {
  block_stored t = s;
  t.block_hashes.clear();
  t.parent_block_hash.reset();
  t.token_ids.clear();
  return t;
}

/// One to three random byte edits (overwrite, bit flip, erase, insert).
inline void mutate(std::string& bytes, rng& r) {
  for (uint64_t m = 1 + r.below(3); m > 0 && !bytes.empty(); --m) {
    size_t at = r.below(bytes.size());
    switch (r.below(4)) {
      case 0: bytes[at] = static_cast<char>(r.u()); break;
      case 1: bytes[at] = static_cast<char>(bytes[at] ^ (1 << r.below(8))); break;
      case 2: bytes.erase(at, 1); break;
      default: bytes.insert(at, 1, static_cast<char>(r.u())); break;
    }
  }
}

} // namespace kvs_test
