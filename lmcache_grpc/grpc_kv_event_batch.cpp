#include "lmcache_grpc/grpc_kv_event_batch.hpp"

#include "lmcache_grpc/grpc_body_reader.hpp"

#include "kv_event_service.pb.h"

namespace kvs {

namespace pb = lmcache::mp;
using grpc_reply::body_reader;
using grpc_reply::each_field;
using msgpack_io::item;
using msgpack_io::value_type;

expected<std::string> grpc_kv_event_batch(std::string_view body) {
  body_reader b{body, "kv event batch"};
  pb::KVEventBatch out;
  auto s = each_field(b, [&](std::string_view f) -> expected<bool> {
    if (f == "enabled" || f == "lost") {
      auto it = b.next(value_type::boolean, "enabled");
      if (!it)
        return it.error_value();
      if (f == "enabled")
        out.set_enabled(it->u != 0);
      else
        out.set_lost(it->u != 0);
      return true;
    }
    if (f == "incarnation" || f == "next_cursor") {
      auto it = b.next(value_type::uint, "incarnation");
      if (!it)
        return it.error_value();
      if (f == "incarnation")
        out.set_incarnation(body_reader::as_int(*it));
      else
        out.set_next_cursor(body_reader::as_int(*it));
      return true;
    }
    if (f != "events")
      return false;
    auto n = b.next(value_type::array, "events");
    if (!n)
      return n.error_value();
    for (uint32_t i = 0; i < n->len; ++i) {
      auto* ev = out.add_events();
      auto e = each_field(b, [&](std::string_view g) -> expected<bool> {
        if (g == "seq")
          return b.field(value_type::uint, "seq",
                         [&](const item& it) { ev->set_seq(body_reader::as_int(it)); });
        if (g == "kind" || g == "medium" || g == "model_name") {
          auto it = b.next(value_type::str, "kind");
          if (!it)
            return it.error_value();
          std::string v{body_reader::as_view(*it)};
          if (g == "kind")
            ev->set_kind(std::move(v));
          else if (g == "medium")
            ev->set_medium(std::move(v));
          else
            ev->set_model_name(std::move(v));
          return true;
        }
        if (g == "block_hashes")
          return b.array_of("block_hashes", value_type::bin, "block_hashes[]",
                            [&](const item& it) {
                              ev->add_block_hashes(std::string{body_reader::as_view(it)});
                            });
        if (g == "parent_block_hash") {
          auto it = b.next();
          if (!it)
            return it.error_value();
          if (it->kind == value_type::bin)
            ev->set_parent_block_hash(std::string{body_reader::as_view(*it)});
          else if (it->kind != value_type::nil)
            return b.fail("parent_block_hash: expected bin or nil");
          return true;
        }
        if (g == "token_ids")
          return b.array_of("token_ids", value_type::uint, "token_ids[]", [&](const item& it) {
            ev->add_token_ids(body_reader::as_int(it));
          });
        return false;
      });
      if (!e)
        return e.error_value();
    }
    return true;
  });
  if (!s)
    return s.error_value();
  return out.SerializeAsString();
}

} // namespace kvs
