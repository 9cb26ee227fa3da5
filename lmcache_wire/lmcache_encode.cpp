// LMCache MP reply bodies, encoded exactly as msgspec encodes them, through
// the shared msgpack_io::writer.
#include "lmcache_wire/lmcache_protocol.hpp"
#include "msgpack/msgpack_writer.hpp"

namespace kvs {

std::string encode_reply_int(int64_t v) {
  std::string out;
  msgpack_io::writer(out).sint(v);
  return out;
}

std::string encode_reply_bool(bool v) {
  std::string out;
  msgpack_io::writer(out).boolean(v);
  return out;
}

std::string encode_reply_str(std::string_view v) {
  std::string out;
  msgpack_io::writer(out).str(v);
  return out;
}

std::string encode_reply_event_ok(std::string_view event_handle, bool ok) {
  std::string out;
  msgpack_io::writer w(out);
  w.array(2);
  w.bin(event_handle);
  w.boolean(ok);
  w.finish();
  return out;
}

std::string encode_reply_str_list(const std::vector<std::string>& v) {
  std::string out;
  msgpack_io::writer w(out);
  w.array(static_cast<uint32_t>(v.size()));
  for (const auto& s : v)
    w.str(s);
  w.finish();
  return out;
}

namespace {

// ShmSlotDescriptor.to_dict(): {"offset", "length", "shape", "dtype"}, in that order.
void write_slots(msgpack_io::writer& w, const std::vector<shm_slot_desc>& slots) {
  w.array(static_cast<uint32_t>(slots.size()));
  for (const auto& d : slots) {
    w.map(4);
    w.key("offset");
    w.uint(d.offset);
    w.key("length");
    w.uint(d.length);
    w.key("shape");
    w.array(static_cast<uint32_t>(d.shape.size()));
    for (int64_t x : d.shape)
      w.sint(x);
    w.key("dtype");
    w.str(d.dtype);
  }
}

void write_uints(msgpack_io::writer& w, const std::vector<uint64_t>& v) {
  w.array(static_cast<uint32_t>(v.size()));
  for (uint64_t i : v)
    w.uint(i);
}

} // namespace

std::string encode_reply_engine_driven_context(std::string_view shm_name, uint64_t pool_size,
                                               std::optional<int64_t> null_block_id) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(null_block_id ? 3 : 2);
  w.key("shm_name");
  w.str(shm_name);
  w.key("pool_size");
  w.uint(pool_size);
  if (null_block_id) {
    w.key("null_block_id");
    w.sint(*null_block_id);
  }
  w.finish();
  return out;
}

std::string encode_reply_server_module_call(bool success, std::string_view payload,
                                            std::string_view error) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(3);
  w.key("success");
  w.boolean(success);
  w.key("payload");
  w.bin(payload);
  w.key("error");
  w.str(error);
  w.finish();
  return out;
}

std::string encode_reply_prepare_store(const std::vector<shm_slot_desc>& slots,
                                       const std::vector<uint64_t>& chunk_indices) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(1);
  w.key("context");
  w.map(2);
  w.key("slots");
  write_slots(w, slots);
  w.key("chunk_indices");
  write_uints(w, chunk_indices);
  w.finish();
  return out;
}

std::string encode_reply_prepare_store_groups(const std::vector<shm_slot_desc>& slots,
                                              const std::vector<uint64_t>& chunk_indices,
                                              const std::vector<uint64_t>& group_ids) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(1);
  w.key("context");
  w.map(3);
  w.key("slots");
  write_slots(w, slots);
  w.key("chunk_indices");
  write_uints(w, chunk_indices);
  w.key("group_ids");
  write_uints(w, group_ids);
  w.finish();
  return out;
}

std::string encode_reply_prepare_retrieve_groups(const std::vector<shm_slot_desc>& slots,
                                                 const std::vector<uint64_t>& group_ids,
                                                 const std::vector<uint64_t>& chunk_indices) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(3);
  w.key("success");
  w.boolean(true);
  w.key("data");
  w.bin({});
  w.key("context");
  w.map(3);
  w.key("slots");
  write_slots(w, slots);
  w.key("group_ids");
  write_uints(w, group_ids);
  w.key("chunk_indices");
  write_uints(w, chunk_indices);
  w.finish();
  return out;
}

std::string encode_reply_prepare_retrieve_inline(std::string_view data) {
  std::string out;
  msgpack_io::writer w(out);
  w.reserve(data.size() + 32);
  w.map(3);
  w.key("success");
  w.boolean(true);
  w.key("data");
  w.bin(data);
  w.key("context");
  w.map(0);
  w.finish();
  return out;
}

std::string encode_reply_prepare_retrieve(bool success, const std::vector<shm_slot_desc>& slots) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(3);
  w.key("success");
  w.boolean(success);
  w.key("data");
  w.bin({});
  w.key("context");
  if (success) {
    w.map(1);
    w.key("slots");
    write_slots(w, slots);
  } else {
    w.map(0);
  }
  w.finish();
  return out;
}

} // namespace kvs
