#include "lmcache_grpc/grpc_key_frame.hpp"

#include "lmcache_grpc/grpc_request_frames.hpp"
#include "msgpack/msgpack_reader.hpp"
#include "msgpack/msgpack_writer.hpp"

namespace kvs {

namespace pb = lmcache::mp;
using msgpack_io::writer;

namespace {

/// 0.5.6's packed `repeated int64 token_ids`: varints, each a token id.
status write_token_varints(writer& w, std::string_view field, std::string_view where) {
  const auto* p = reinterpret_cast<const uint8_t*>(field.data());
  const size_t n = field.size();
  uint32_t count = 0;
  for (size_t i = 0; i < n; ++i)
    count += (p[i] & 0x80) == 0;
  if (n > 0 && (p[n - 1] & 0x80) != 0)
    return grpc_bad_request(where, "token_ids: truncated varint at byte " + std::to_string(n - 1));
  w.array(count);
  size_t i = 0;
  for (uint32_t k = 0; k < count; ++k) {
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
      const uint8_t b = p[i++];
      if (shift < 64)
        v |= uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if ((b & 0x80) == 0)
        break;
      if (shift >= 70)
        return grpc_bad_request(where, "token_ids[" + std::to_string(k) +
                                         "]: varint longer than 10 bytes");
    }
    // LMCache hashes tokens as big-endian uint32 (token_hasher.py).
    if (v > 0xffffffffULL)
      return grpc_bad_request(where, "token_ids[" + std::to_string(k) + "] = " +
                                       std::to_string(static_cast<int64_t>(v)) +
                                       " is outside [0, 2^32)");
    w.uint(v);
  }
  return {};
}

status write_key(writer& w, const pb::IpcCacheServerKey& k, client_release rel,
                 std::string_view where) {
  w.map(10);
  w.key("model_name");
  w.str(k.model_name());
  w.key("world_size");
  w.sint(k.world_size());
  w.key("worker_id");
  if (k.has_worker_id())
    w.sint(k.worker_id());
  else
    w.nil();
  if (rel == client_release::v0_5_7) {
    w.key("token_bytes");
    w.bin(k.token_bytes());
  } else {
    w.key("token_ids");
    if (auto r = write_token_varints(w, k.token_bytes(), where); !r)
      return r;
  }
  w.key("start");
  w.sint(k.start());
  w.key("end");
  w.sint(k.end());
  w.key("request_id");
  w.str(k.request_id());
  w.key("cache_salt");
  w.str(k.cache_salt());
  w.key("request_configs");
  // dict | None travels as msgpack bytes (proto_codec.py _encode_mapping).
  const auto& rc = k.encoded_request_configs();
  if (!k.has_encoded_request_configs() || rc.empty()) {
    w.nil();
  } else {
    msgpack_io::reader r{reinterpret_cast<const uint8_t*>(rc.data()), rc.size()};
    if (!r.skip(1) || r.remaining() != 0)
      return grpc_bad_request(where, "encoded_request_configs: not one msgpack value");
    w.raw(rc.data(), rc.size());
  }
  w.key("num_kv_readers");
  w.sint(k.num_kv_readers());
  return {};
}

} // namespace

expected<std::string> grpc_key_frame(const pb::IpcCacheServerKey& k, client_release rel,
                                     std::string_view where) {
  std::string out;
  writer w{out};
  if (auto r = write_key(w, k, rel, where); !r)
    return r.error_value();
  w.finish();
  return out;
}

client_release grpc_key_release(client_release dialect, const pb::IpcCacheServerKey& k) {
  return dialect != client_release::unknown ? dialect
                                            : guess_token_release(k.token_bytes(), k.end());
}

client_release guess_token_release(std::string_view token_field, int64_t end) {
  const auto* p = reinterpret_cast<const uint8_t*>(token_field.data());
  const size_t n = token_field.size();
  if (n == 0 || n % 4 != 0)
    return client_release::v0_5_6;
  for (size_t i = 0; i < n; i += 4)
    if (p[i] != 0)
      return client_release::v0_5_6;
  // Words too few for the key's range: varints (e.g. token 0 repeated).
  if (end > 0 && n / 4 < static_cast<uint64_t>(end)) {
    size_t varints = 0;
    for (size_t i = 0; i < n; ++i)
      varints += (p[i] & 0x80) == 0;
    if (varints >= static_cast<uint64_t>(end))
      return client_release::v0_5_6;
  }
  return client_release::v0_5_7;
}

} // namespace kvs
