// KV event batch encoding: the bytes msgspec writes for vLLM's and
// tokenspeed's structs, through the shared msgpack_io::writer.
#include "events_wire/kv_event_codec.hpp"
#include "events_wire/kv_event_schema.hpp"
#include "msgpack/msgpack_writer.hpp"

namespace kvs {
namespace {

using namespace event_schema;

class event_writer {
public:
  explicit event_writer(std::string& out) : w_(out) {}

  void batch(const kv_event_batch& b, event_dialect d) {
    // A rough size so the buffer grows at most once per batch.
    w_.reserve(16 + b.events.size() * 256);
    layout_ = b.stored_layout;
    w_.array(3);
    w_.float64(b.ts);
    w_.array(static_cast<uint32_t>(b.events.size()));
    for (const kv_event& e : b.events) {
      if (d == event_dialect::vllm)
        std::visit([this](const auto& ev) { vllm(ev); }, e);
      else
        std::visit([this](const auto& ev) { tokenspeed(ev); }, e);
    }
    opt_int(b.dp_rank);
    w_.finish();
  }

private:
  void hashes(const std::vector<uint64_t>& hs) {
    w_.array(static_cast<uint32_t>(hs.size()));
    for (uint64_t h : hs)
      w_.uint(h);
  }
  void opt_hash(const std::optional<uint64_t>& h) {
    if (h)
      w_.uint(*h);
    else
      w_.nil();
  }
  void opt_int(const std::optional<int64_t>& v) {
    if (v)
      w_.sint(*v);
    else
      w_.nil();
  }
  void opt_str(const std::optional<std::string>& s) {
    if (s)
      w_.str(*s);
    else
      w_.nil();
  }
  void tokens(const std::vector<int64_t>& ts) {
    w_.array(static_cast<uint32_t>(ts.size()));
    for (int64_t t : ts)
      w_.sint(t);
  }

  /// SGLang's cache_salt, carried the way vLLM carries a salt: vLLM puts
  /// the request's cache_salt (a bare str) into the extra_keys entry of the
  /// block that starts at token 0 only (generate_block_hash_extra_keys), so
  /// the entry of block 0 is ("salt",) when the event starts a chain
  /// (parent_block_hash None) and every other entry is None; in a
  /// continuation the salt is implied by the parent chain, as in vLLM. An
  /// event that already has extra_keys keeps them as they are.
  bool salt_as_extra_keys(const block_stored& e) const {
    return e.cache_salt && !e.extra_keys_msgpack && !e.parent_block_hash &&
           !e.block_hashes.empty();
  }
  void salt_extra_keys(const block_stored& e) {
    w_.array(static_cast<uint32_t>(e.block_hashes.size()));
    w_.array(1);
    w_.str(*e.cache_salt);
    for (size_t k = 1; k < e.block_hashes.size(); ++k)
      w_.nil();
  }

  // -- vLLM 0.33 (and 0.32) tagged maps -------------------------------------
  void vllm(const block_stored& e) {
    const bool salt = salt_as_extra_keys(e);
    // 0.32's struct has no lookahead_token_ids: an event that has them is
    // written as 0.33 writes it (never from decode_event_batch: it says
    // v0_32 only for batches without them).
    const bool v032 = layout_ == vllm_stored_layout::v0_32 && !e.lookahead_token_ids;
    uint32_t n = 1 + stored_always + ((e.extra_keys_msgpack || salt) ? 1 : 0) +
                 (e.group_idx ? 1 : 0) + (e.kv_cache_spec_kind ? 1 : 0) +
                 (e.kv_cache_spec_sliding_window ? 1 : 0) + (e.locality ? 1 : 0) +
                 (e.ownership ? 1 : 0) + (e.session_id ? 1 : 0) +
                 (e.lookahead_token_ids ? 1 : 0);
    w_.map_for(n, v032 ? stored_max_entries_032 : stored_max_entries);
    name(type_key);
    name(tag_stored);
    name(stored_names[sf_block_hashes]);
    hashes(e.block_hashes);
    name(stored_names[sf_parent_block_hash]);
    opt_hash(e.parent_block_hash);
    name(stored_names[sf_token_ids]);
    tokens(e.token_ids);
    name(stored_names[sf_block_size]);
    w_.sint(e.block_size);
    name(stored_names[sf_lora_id]);
    opt_int(e.lora_id);
    name(stored_names[sf_medium]);
    opt_str(e.medium);
    name(stored_names[sf_lora_name]);
    opt_str(e.lora_name);
    if (e.extra_keys_msgpack) {
      name(stored_names[sf_extra_keys]);
      w_.raw(e.extra_keys_msgpack->data(), e.extra_keys_msgpack->size());
    } else if (salt) {
      name(stored_names[sf_extra_keys]);
      salt_extra_keys(e);
    }
    if (e.group_idx) {
      name(stored_names[sf_group_idx]);
      w_.sint(*e.group_idx);
    }
    if (e.kv_cache_spec_kind) {
      name(stored_names[sf_kv_cache_spec_kind]);
      w_.str(*e.kv_cache_spec_kind);
    }
    if (e.kv_cache_spec_sliding_window) {
      name(stored_names[sf_kv_cache_spec_sliding_window]);
      w_.sint(*e.kv_cache_spec_sliding_window);
    }
    if (e.locality) {
      name(stored_names[sf_locality]);
      w_.str(*e.locality);
    }
    if (e.ownership) {
      name(stored_names[sf_ownership]);
      w_.str(*e.ownership);
    }
    if (e.session_id) {
      name(stored_names[sf_session_id]);
      w_.str(*e.session_id);
    }
    if (e.lookahead_token_ids) {
      name(stored_names[sf_lookahead_token_ids]);
      w_.array(static_cast<uint32_t>(e.lookahead_token_ids->size()));
      for (const auto& ts : *e.lookahead_token_ids)
        tokens(ts);
    }
  }

  void vllm(const block_removed& e) {
    uint32_t n = 1 + removed_always + (e.group_idx ? 1 : 0) + (e.locality ? 1 : 0) +
                 (e.ownership ? 1 : 0);
    w_.map_for(n, removed_max_entries);
    name(type_key);
    name(tag_removed);
    name(removed_names[rf_block_hashes]);
    hashes(e.block_hashes);
    name(removed_names[rf_medium]);
    opt_str(e.medium);
    if (e.group_idx) {
      name(removed_names[rf_group_idx]);
      w_.sint(*e.group_idx);
    }
    if (e.locality) {
      name(removed_names[rf_locality]);
      w_.str(*e.locality);
    }
    if (e.ownership) {
      name(removed_names[rf_ownership]);
      w_.str(*e.ownership);
    }
  }

  void vllm(const all_blocks_cleared&) {
    w_.map_for(1, 1);
    name(type_key);
    name(tag_cleared);
  }

  // -- tokenspeed positional arrays ----------------------------------------
  void tokenspeed(const block_stored& e) {
    w_.array(5);
    name(tag_stored);
    hashes(e.block_hashes);
    opt_hash(e.parent_block_hash);
    tokens(e.token_ids);
    w_.sint(e.block_size);
  }

  void tokenspeed(const block_removed& e) {
    w_.array(2);
    name(tag_removed);
    hashes(e.block_hashes);
  }

  void tokenspeed(const all_blocks_cleared&) {
    w_.array(1);
    name(tag_cleared);
  }

  /// A field name or tag, from the one table the decoder reads too.
  void name(name_ref n) { w_.str(std::string_view{n.s, n.n}); }

  msgpack_io::writer w_;
  vllm_stored_layout layout_ = vllm_stored_layout::v0_33;
};

} // namespace

void encode_event_batch(const kv_event_batch& batch, event_dialect dialect, std::string& out) {
  event_writer(out).batch(batch, dialect);
}

} // namespace kvs
