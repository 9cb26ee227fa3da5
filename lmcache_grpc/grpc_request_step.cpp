#include "lmcache_grpc/grpc_request_step.hpp"

#include "msgpack/msgpack_reader.hpp"

namespace kvs::grpc_request {

void arg_frames::sint(int64_t v) {
  add([&](writer& w) { w.sint(v); });
}

void arg_frames::str(std::string_view v) {
  add([&](writer& w) { w.str(v); });
}

void arg_frames::bin(std::string_view v) {
  add([&](writer& w) { w.bin(v); });
}

namespace {

// One group's ids, with the writer's integer encoding inlined into the loop
// (flatten): a group has hundreds of ids, and GCC -O2 left that call out of
// line here, ~8% of a 128-block STORE's transcode.
[[gnu::flatten]] void write_ids(writer& w, const google::protobuf::RepeatedField<int64_t>& ids) {
  w.array(static_cast<uint32_t>(ids.size()));
  for (auto b : ids)
    w.sint(b);
}

} // namespace

void arg_frames::block_groups(
  const google::protobuf::RepeatedPtrField<lmcache::mp::BlockIdGroup>& groups) {
  add([&](writer& w) {
    w.array(static_cast<uint32_t>(groups.size()));
    for (const auto& g : groups)
      write_ids(w, g.block_ids());
  });
}

void arg_frames::mapping(const std::string& bytes, const char* field) {
  if (bytes.empty())
    return add([](writer& w) { w.map(0); });
  msgpack_io::reader r{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  msgpack_io::item it;
  if (!r.next(it) || it.kind != msgpack_io::value_type::map)
    return fail(field, "not a msgpack map");
  r.seek(0);
  if (!r.skip(1) || r.remaining() != 0)
    return fail(field, "not one msgpack value");
  add_encoded(bytes);
}

void arg_frames::fail(const char* field, std::string why) {
  fail(grpc_bad_request(std::string(message_) + "." + field, std::move(why)));
}

void arg_frames::fail(error e) {
  if (!failed_)
    failed_ = std::move(e);
}

expected<frames_t> arg_frames::take() && {
  if (failed_)
    return std::move(*failed_);
  return std::move(frames_);
}

} // namespace kvs::grpc_request
