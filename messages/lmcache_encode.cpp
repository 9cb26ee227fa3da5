// LMCache MP reply bodies, encoded exactly as msgspec encodes them, through
// the shared msgpack_io::writer.
#include "messages/lmcache_protocol.hpp"
#include "messages/msgpack_writer.hpp"

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

} // namespace kvs
