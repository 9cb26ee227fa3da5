// The one step every gRPC request takes to its ZeroMQ frames:
//   parse  the message (refused, naming it, when it is not one);
//   check  which release the client is: as latched, else what a field only
//          0.5.7 sends shows, else (keyed messages) what the key's token
//          field shows (grpc_key_frame.hpp);
//   key    the key frame first, for every message that has a key;
//   frames the row's own fields, in the order a ZeroMQ client of that
//          release sends them (arg_frames).
// A row (grpc_request_frames.cpp) is only the last part, plus the 0.5.7
// field for the messages that have one. Internal to the request side.
#pragma once

#include "core/error.hpp"
#include "lmcache_grpc/grpc_key_frame.hpp"
#include "lmcache_grpc/grpc_request_frames.hpp"
#include "msgpack/msgpack_writer.hpp"

#include <google/protobuf/descriptor.h>

#include <climits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvs::grpc_request {

using frames_t = std::vector<std::string>;
using msgpack_io::writer;

/// One frame: what `fill` writes.
template <class Fill>
std::string frame(Fill&& fill) {
  std::string out;
  writer w{out};
  fill(w);
  w.finish();
  return out;
}

/// The frames a row writes, in order. A field found bad refuses the request
/// (the first reason is kept, and nothing more is written), so a row is a
/// plain list of its fields with no error handling of its own.
class arg_frames {
public:
  arg_frames(std::string_view message, client_release release)
    : message_(message), release_(release) {}

  /// The client's release for this request (latched, or what it showed).
  client_release release() const { return release_; }

  void sint(int64_t v);
  void str(std::string_view v);
  void bin(std::string_view v);
  /// A frame `fill` writes.
  template <class Fill>
  void add(Fill&& fill) {
    if (!failed_)
      frames_.push_back(frame(std::forward<Fill>(fill)));
  }
  /// A frame already encoded (the key).
  void add_encoded(std::string f) {
    if (!failed_)
      frames_.push_back(std::move(f));
  }
  /// A dict that travels as msgpack bytes (empty bytes are {}, as LMCache
  /// sends them); anything but one msgpack map refuses the request.
  void mapping(const std::string& bytes, const char* field);
  /// Block ids per KV-cache group: a list of int lists.
  void block_groups(const google::protobuf::RepeatedPtrField<lmcache::mp::BlockIdGroup>& groups);
  /// The list argument 0.5.7 always adds (free_lookup_locks, prepare_store):
  /// written for a 0.5.7 client, and refused with entries from a client that
  /// showed 0.5.6 (proto3 drops an empty list, so the latch decides then).
  template <class Items, class WriteItem>
  void list_057(const char* field, const Items& items, WriteItem&& write_item) {
    if (release_ != client_release::v0_5_7) {
      if (items.size() > 0)
        fail(field, "0.5.7's field from a client that showed 0.5.6");
      return;
    }
    add([&](writer& w) {
      w.array(static_cast<uint32_t>(items.size()));
      for (const auto& item : items)
        write_item(w, item);
    });
  }
  /// Refuses the request: "<message>.<field>: why".
  void fail(const char* field, std::string why);
  void fail(error e);

  expected<frames_t> take() &&;

private:
  std::string_view message_;
  client_release release_;
  frames_t frames_;
  std::optional<error> failed_;
};

/// What a row says about its message type: the frames after its key, and
/// (for messages with one) whether a field only 0.5.7 sends is set.
template <class Msg>
struct row_of {
  void (*frames)(const Msg&, arg_frames&) = nullptr;
  bool (*shows_057)(const Msg&) = nullptr;
};

template <class Msg, class = void>
struct has_key : std::false_type {};
template <class Msg>
struct has_key<Msg, std::void_t<decltype(std::declval<const Msg&>().key())>> : std::true_type {};

/// The message's name as LMCache's .proto spells it ("LookupRequest").
template <class Msg>
std::string_view message_name() {
  const auto& n = Msg::descriptor()->name();
  return {n.data(), n.size()};
}

/// parse -> check -> key -> frames for one message type.
template <class Msg>
expected<frames_t> transcode(const row_of<Msg>& row, std::string_view bytes,
                             client_release dialect) {
  const std::string_view name = message_name<Msg>();
  Msg msg;
  if (bytes.size() > static_cast<size_t>(INT_MAX)
      || !msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return grpc_bad_request(name, "not a valid protobuf message (" + std::to_string(bytes.size()) +
                                    " bytes)");
  client_release rel = dialect;
  if (rel == client_release::unknown && row.shows_057 && row.shows_057(msg))
    rel = client_release::v0_5_7;
  std::optional<std::string> key;
  if constexpr (has_key<Msg>::value) {
    rel = grpc_key_release(rel, msg.key());
    auto k = grpc_key_frame(msg.key(), rel, std::string(name) + ".key");
    if (!k)
      return k.error_value();
    key = std::move(*k);
  }
  arg_frames a{name, rel};
  if (key)
    a.add_encoded(std::move(*key));
  if (row.frames)
    row.frames(msg, a);
  return std::move(a).take();
}

} // namespace kvs::grpc_request
