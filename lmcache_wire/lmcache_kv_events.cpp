#include "lmcache_wire/lmcache_kv_events.hpp"

#include "msgpack/msgpack_reader.hpp"
#include "msgpack/utf8.hpp"

#include <msgpack.hpp>

namespace kvs {

namespace {

error bad(size_t i, const char* name, const std::string& what) {
  return error{"bad_arg", "subscribe_kv_events arg " + std::to_string(i) + " '" + name
                            + "': " + what};
}

/// One msgpack value filling the whole frame, read in place (no object
/// tree: a declared container length allocates nothing).
bool one_item(std::string_view frame, msgpack_io::item& it) {
  msgpack_io::reader r(reinterpret_cast<const uint8_t*>(frame.data()), frame.size());
  return r.next(it) && r.remaining() == 0;
}

status read_int(std::string_view frame, size_t i, const char* name,
                int64_t& out) {
  msgpack_io::item it;
  if (!one_item(frame, it))
    return bad(i, name, "not one msgpack value");
  if (it.kind == msgpack_io::value_type::uint) {
    if (it.u > static_cast<uint64_t>(INT64_MAX))
      return bad(i, name, "int out of range");
    out = static_cast<int64_t>(it.u);
    return {};
  }
  if (it.kind == msgpack_io::value_type::sint) {
    out = it.i;
    return {};
  }
  return bad(i, name, "expected an int");
}

void put_hash(msgpack::packer<msgpack::sbuffer>& pk, uint64_t h) {
  char be[8];
  for (int i = 0; i < 8; ++i)
    be[i] = static_cast<char>(h >> (56 - 8 * i));
  pk.pack_bin(8);
  pk.pack_bin_body(be, 8);
}

void put_str(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

} // namespace

expected<subscribe_kv_events_req>
decode_subscribe_kv_events(const std::vector<std::string_view>& args) {
  if (args.size() != 4)
    return error{"arity", "subscribe_kv_events takes 4 argument(s), got "
                            + std::to_string(args.size())};
  subscribe_kv_events_req r;
  if (auto e = read_int(args[0], 0, "instance_id", r.instance_id); !e)
    return e.error_value();
  {
    msgpack_io::item it;
    if (!one_item(args[1], it) || it.kind != msgpack_io::value_type::str)
      return bad(1, "model_name", "expected a str");
    std::string_view s{reinterpret_cast<const char*>(it.ptr), it.len};
    if (!valid_utf8(reinterpret_cast<const uint8_t*>(s.data()), s.size()))
      return bad(1, "model_name", "not valid UTF-8");
    r.model_name.assign(s);
  }
  if (auto e = read_int(args[2], 2, "cursor", r.cursor); !e)
    return e.error_value();
  if (auto e = read_int(args[3], 3, "max_events", r.max_events); !e)
    return e.error_value();
  // LMCache raises ValueError for these (and then sends nothing).
  if (r.cursor < 0)
    return bad(2, "cursor", "must be >= 0, got " + std::to_string(r.cursor));
  if (r.max_events < 1 || r.max_events > 1024)
    return bad(3, "max_events", "must be in [1, 1024], got " + std::to_string(r.max_events));
  return r;
}

std::string encode_kv_event_batch(const kv_event_batch_out& b) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(5);
  put_str(pk, "enabled");
  pk.pack(b.enabled);
  put_str(pk, "incarnation");
  pk.pack(b.incarnation);
  put_str(pk, "next_cursor");
  pk.pack(b.next_cursor);
  put_str(pk, "lost");
  pk.pack(b.lost);
  put_str(pk, "events");
  pk.pack_array(static_cast<uint32_t>(b.events.size()));
  for (const auto* r : b.events) {
    pk.pack_map(7);
    put_str(pk, "seq");
    pk.pack(r->seq);
    put_str(pk, "kind");
    put_str(pk, r->stored ? "stored" : "removed");
    put_str(pk, "medium");
    put_str(pk, "CPU");
    put_str(pk, "model_name");
    put_str(pk, r->model_name);
    put_str(pk, "block_hashes");
    pk.pack_array(static_cast<uint32_t>(r->block_hashes.size()));
    for (auto h : r->block_hashes)
      put_hash(pk, h);
    put_str(pk, "parent_block_hash");
    if (r->parent_block_hash)
      put_hash(pk, *r->parent_block_hash);
    else
      pk.pack_nil();
    put_str(pk, "token_ids");
    pk.pack_array(static_cast<uint32_t>(r->token_ids.size()));
    for (auto t : r->token_ids)
      pk.pack(t);
  }
  return std::string{buf.data(), buf.size()};
}

} // namespace kvs
