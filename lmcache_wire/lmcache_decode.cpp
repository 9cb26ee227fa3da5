// LMCache MP request decoding, frame level (see lmcache_protocol.hpp): the
// op frame resolved to its row of the op table (lmcache_ops.cpp), the
// argument count checked against the row, the arguments decoded by the
// row's body decoder (lmcache_body_decode.cpp), and the client release the
// request shows. Never throws.
#include "lmcache_wire/lmcache_body_decode.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/lmcache_reads.hpp"

#include <limits>
#include <type_traits>
#include <utility>

namespace kvs {
namespace {

using namespace lmcache_wire;

/// LMCache 0.5.6 operations kvsidecar does not serve, with their legacy ids
/// (0 = routed by name only). Named in errors so logs say what was asked.
struct foreign_op {
  int id;
  const char* name;
};
constexpr foreign_op k_foreign_ops[] = {
    {3, "register_q_cache"},
    {4, "unregister_q_cache"},
    {5, "store_q"},
    {25, "cb_register_rope"},
    {26, "cb_unregister_rope"},
    {27, "cb_retrieve_pre_computed"},
    {28, "cb_unified_lookup"},
    {29, "p2p_lookup_and_lock"},
    {30, "p2p_query_lookup_results"},
    {31, "p2p_unlock_objects"},
    {33, "cb_protocol_handshake"},
    {0, "cb_reorder_plan"},
};


error bad_arg(const error& e) { return error{"bad_arg", e.detail}; }

std::string shown(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 48)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return out;
}

/// Resolves the op frame: a legacy id (msgpack int) or a snake_case name.
expected<const mp_op_row*> decode_op(std::string_view frame) {
  if (frame.empty())
    return error{"unsupported_op", "empty op frame (event-stream control: subscribe_kv_events is not served)"};
  cursor c(frame);
  item it;
  if (c.next(it) || !c.at_end()) return error{"unknown_op", "op frame is not one msgpack value"};
  if (it.kind == mk::uint || it.kind == mk::sint) {
    // Ids are small; anything beyond int64 is simply not one of them.
    int64_t id = it.kind == mk::sint ? it.i
                 : it.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1
                                                                                    : static_cast<int64_t>(it.u);
    // The 0.5.5+ ids, and 0.5.3 / 0.5.4's where theirs differ.
    if (const auto* row = op_row_by_id(id)) return row;
    for (const auto& f : k_foreign_ops)
      if (f.id != 0 && f.id == id)
        return error{"unsupported_op", std::string("op ") + std::to_string(id) + " (" + f.name + ") is not served"};
    return error{"unknown_op", "unknown legacy op id " + (it.kind == mk::uint ? std::to_string(it.u) : std::to_string(it.i))};
  }
  if (it.kind == mk::str) {
    std::string_view name(reinterpret_cast<const char*>(it.ptr), it.len);
    if (const auto* row = op_row_by_name(name)) {
      // A stream is the engine bridge's (streamed_row), never a request.
      if (row->streamed) return error{"unsupported_op", "op '" + std::string(name) + "' is not served as a request (it is a stream)"};
      return row;
    }
    for (const auto& f : k_foreign_ops)
      if (name == f.name) return error{"unsupported_op", "op '" + std::string(name) + "' is not served"};
    return error{"unknown_op", "unknown op name '" + shown(name) + "'"};
  }
  return error{"unknown_op", std::string("op frame holds a ") + mk_name(it.kind) + ", not an int or str"};
}

template <class T, class = void>
struct has_key : std::false_type {};
template <class T>
struct has_key<T, std::void_t<decltype(std::declval<const T&>().key.release)>> : std::true_type {};

/// The release a decoded request shows (its key's token form, its argument
/// count, ops only one release has), or an error when it mixes two.
expected<client_release> release_shown(const mp_op_row& row, const mp_request& r,
                                       std::string_view op_frame, size_t nargs) {
  client_release rel = client_release::unknown;
  std::visit([&](const auto& b) {
    if constexpr (has_key<std::decay_t<decltype(b)>>::value) rel = b.key.release;
  }, r.body);
  if (row.last_arg_057) {
    // 0.5.7 binds every default, so its calls always carry the last argument.
    const bool all_args = nargs == row.max_args;
    if (all_args != (rel == client_release::v0_5_7))
      return error{"bad_arg", std::string(row.name) + " with " + std::to_string(nargs) +
                                  " arguments and a key of " +
                                  (rel == client_release::v0_5_7 ? "token_bytes (0.5.7 sends 3 arguments)"
                                                                 : "token_ids (only 0.5.7 sends 3 arguments)")};
  }
  if (row.only_in != client_release::unknown)
    rel = row.only_in;
  if (row.release_of)
    rel = row.release_of(r.body);
  // Sent by the id only 0.5.3 / 0.5.4 use (a one-byte fixint, as they send it).
  if (row.id_pre_055 >= 0 && op_frame.size() == 1 &&
      static_cast<uint8_t>(op_frame[0]) == static_cast<uint8_t>(row.id_pre_055))
    rel = client_release::legacy;
  return rel;
}

} // namespace

const mp_op_row* streamed_row(std::string_view op_frame) {
  if (op_frame.empty()) return nullptr; // stream control (ack / cancel)
  cursor c(op_frame);
  item it;
  if (c.next(it) || !c.at_end() || it.kind != mk::str) return nullptr; // streams travel by name
  const auto* row = op_row_by_name(std::string_view(reinterpret_cast<const char*>(it.ptr), it.len));
  return row && row->streamed ? row : nullptr;
}

const char* to_string(client_release r) {
  switch (r) {
    case client_release::unknown: return "unknown";
    case client_release::legacy: return "0.5.3-0.5.5";
    case client_release::v0_5_6: return "0.5.6";
    case client_release::v0_5_7: return "0.5.7";
  }
  return "?";
}

expected<mp_request> decode_mp_request(const std::vector<std::string_view>& frames) {
  if (frames.size() < 2)
    return error{"bad_frames", "expected uid, op and arguments; got " + std::to_string(frames.size()) + " frame(s)"};
  mp_request req;
  {
    // The uid is opaque: echoed, never interpreted (LMCache's server does
    // not decode it either, and answers whatever it is).
    cursor c(frames[0]);
    item it;
    int64_t uid = -1;
    if (c.next(it) || !c.at_end() || !as_int64(it, "uid", uid))
      uid = -1;
    req.uid = uid;
  }
  auto op = decode_op(frames[1]);
  if (!op) return op.error_value();
  const mp_op_row& row = **op;
  std::vector<std::string_view> args(frames.begin() + 2, frames.end());
  if (args.size() < row.min_args || args.size() > row.max_args) {
    std::string want = row.min_args == row.max_args
                           ? std::to_string(row.min_args)
                           : std::to_string(row.min_args) + ".." + std::to_string(row.max_args);
    return error{"arity", std::string(row.name) + " takes " + want + " argument(s), got " + std::to_string(args.size())};
  }
  if (auto e = decode_body(row, args, req.body); !e) return bad_arg(e.error_value());
  req.op = row.op;
  auto rel = release_shown(row, req, frames[1], args.size());
  if (!rel) return rel.error_value();
  req.release = rel.value();
  req.uid_frame.assign(frames[0].data(), frames[0].size());
  req.op_frame.assign(frames[1].data(), frames[1].size());
  return req;
}

} // namespace kvs
