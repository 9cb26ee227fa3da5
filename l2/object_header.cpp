#include "l2/object_header.hpp"

#include <cstdio>
#include <cstring>
#include <xxhash.h>

namespace kvs {

namespace {

constexpr uint64_t k_magic = 0x4a424f324c53564bULL; // "KVSL2OBJ" little-endian

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

} // namespace

uint64_t l2_model_fingerprint(std::string_view model, std::string_view salt) {
  std::string buf;
  buf.reserve(model.size() + salt.size() + 1);
  buf.append(model);
  buf.push_back('\0');
  buf.append(salt);
  return XXH3_64bits(buf.data(), buf.size());
}

void encode_l2_header(const l2_object_id& id, uint64_t payload_bytes, uint8_t* out) {
  std::memset(out, 0, l2_header_bytes);
  put_u64(out + 0, k_magic);
  put_u32(out + 8, l2_header_version);
  put_u32(out + 12, static_cast<uint32_t>(l2_header_bytes));
  put_u64(out + 16, payload_bytes);
  put_u64(out + 24, id.hash);
  put_u32(out + 32, static_cast<uint32_t>(id.rank));
  put_u64(out + 40, id.model);
  put_u64(out + 48, id.layout);
  put_u64(out + 56, XXH3_64bits(out, 56));
}

const char* to_string(l2_header_check c) {
  switch (c) {
    case l2_header_check::ok: return "ok";
    case l2_header_check::short_object: return "shorter than a header";
    case l2_header_check::bad_magic: return "not a kvsidecar L2 object (magic)";
    case l2_header_check::bad_version: return "unknown header version";
    case l2_header_check::bad_checksum: return "header checksum mismatch";
    case l2_header_check::wrong_key: return "another chunk's object";
    case l2_header_check::wrong_model: return "another model's object";
    case l2_header_check::wrong_layout: return "another layout's object";
    case l2_header_check::wrong_size: return "payload size mismatch (truncated?)";
  }
  return "?";
}

bool peek_l2_header(const uint8_t* h, l2_object_id* id, uint64_t* payload_bytes) {
  if (get_u64(h) != k_magic || get_u32(h + 8) != l2_header_version
      || get_u32(h + 12) != l2_header_bytes || get_u64(h + 56) != XXH3_64bits(h, 56))
    return false;
  id->hash = get_u64(h + 24);
  id->rank = static_cast<int32_t>(get_u32(h + 32));
  id->model = get_u64(h + 40);
  id->layout = get_u64(h + 48);
  *payload_bytes = get_u64(h + 16);
  return true;
}

l2_header_check check_l2_header(const uint8_t* h, size_t object_bytes, const l2_object_id& expect,
                                uint64_t* payload_bytes) {
  if (object_bytes < l2_header_bytes)
    return l2_header_check::short_object;
  if (get_u64(h) != k_magic)
    return l2_header_check::bad_magic;
  if (get_u32(h + 8) != l2_header_version || get_u32(h + 12) != l2_header_bytes)
    return l2_header_check::bad_version;
  if (get_u64(h + 56) != XXH3_64bits(h, 56))
    return l2_header_check::bad_checksum;
  if (get_u64(h + 24) != expect.hash || static_cast<int32_t>(get_u32(h + 32)) != expect.rank)
    return l2_header_check::wrong_key;
  if (expect.model != 0 && get_u64(h + 40) != expect.model)
    return l2_header_check::wrong_model;
  if (expect.layout != 0 && get_u64(h + 48) != expect.layout)
    return l2_header_check::wrong_layout;
  auto payload = get_u64(h + 16);
  if (payload != object_bytes - l2_header_bytes)
    return l2_header_check::wrong_size;
  if (payload_bytes)
    *payload_bytes = payload;
  return l2_header_check::ok;
}

std::string l2_key_string(std::string_view prefix, std::string_view model, int32_t rank,
                          uint32_t group, uint64_t hash, std::string_view salt) {
  char mid[64];
  int n = std::snprintf(mid, sizeof mid, "@%08x@%x@%016llx", static_cast<uint32_t>(rank), group,
                        static_cast<unsigned long long>(hash));
  std::string out;
  out.reserve(prefix.size() + model.size() + static_cast<size_t>(n) + salt.size() + 1);
  out.append(prefix).append(model).append(mid, static_cast<size_t>(n));
  if (!salt.empty())
    out.append("@").append(salt);
  return out;
}

} // namespace kvs
