#include "l2/l2_naming.hpp"

#include "l2/lmcache_object_name.hpp"
#include "l2/object_header.hpp"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

namespace kvs {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// A salt a name can carry: LMCache's ObjectKey rules (no '@', '/', '\\', NUL).
bool salt_nameable(std::string_view salt) {
  return lmcache_nameable("m", salt);
}

bool hex8(std::string_view s) {
  return s.size() == 8 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

std::string be64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8)
    out[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

std::optional<uint64_t> from_be64(std::string_view b) {
  if (b.empty() || b.size() > 8)
    return std::nullopt;
  uint64_t v = 0;
  for (unsigned char c : b)
    v = (v << 8) | c;
  return v;
}

/// A Redis key body, model@<rank:08x>@<group:x>@<hash hex>[@salt], in both
/// formats. A kvsidecar model may hold '@', so the fields are read from the
/// end: the salt is there when the field three before the last is the rank.
std::optional<object_key_fields> parse_key_body(std::string_view body) {
  std::vector<std::string_view> parts;
  for (size_t at = 0;;) {
    auto sep = body.find('@', at);
    parts.push_back(body.substr(at, sep == std::string_view::npos ? sep : sep - at));
    if (sep == std::string_view::npos)
      break;
    at = sep + 1;
  }
  const size_t n = parts.size();
  size_t rank_at = 0;
  object_key_fields f;
  if (n >= 5 && hex8(parts[n - 4])) {
    rank_at = n - 4;
    f.salt = std::string(parts[n - 1]);
  } else if (n >= 4 && hex8(parts[n - 3])) {
    rank_at = n - 3;
  } else {
    return std::nullopt;
  }
  auto rank = parse_hex32(parts[rank_at]);
  auto group = parse_hex32(parts[rank_at + 1]);
  auto hash = parse_hex_bytes(parts[rank_at + 2]);
  if (!rank || !group || !hash)
    return std::nullopt;
  f.kv_rank = *rank;
  f.group = *group;
  f.chunk_hash = std::move(*hash);
  auto model_end = static_cast<size_t>(parts[rank_at].data() - body.data()) - 1;
  f.model = std::string(body.substr(0, model_end));
  return f;
}

class kvsidecar_naming final : public l2_naming {
public:
  std::optional<std::string> file_name(const l2_key& k) const override {
    if (!salt_nameable(k.salt))
      return std::nullopt;
    char name[40];
    std::snprintf(name, sizeof name, "%08x@%016" PRIx64, static_cast<uint32_t>(k.rank), k.hash);
    std::string out = name;
    if (!k.salt.empty())
      out.append("@").append(k.salt);
    return out.append(k_suffix);
  }

  std::optional<l2_name_fields> parse_file_name(std::string_view name) const override {
    if (!ends_with(name, k_suffix) || name.size() < 25 + k_suffix.size() || name[8] != '@')
      return std::nullopt;
    name.remove_suffix(k_suffix.size());
    unsigned rank = 0;
    unsigned long long hash = 0;
    char tail = 0;
    std::string head(name.substr(0, 25));
    if (std::sscanf(head.c_str(), "%8x@%16llx%c", &rank, &hash, &tail) != 2)
      return std::nullopt;
    l2_name_fields f;
    f.hash = hash;
    f.rank = static_cast<int32_t>(rank);
    if (name.size() > 25) {
      if (name[25] != '@' || name.size() == 26 || !salt_nameable(name.substr(26)))
        return std::nullopt;
      f.salt = std::string(name.substr(26));
    }
    return f;
  }

  std::optional<std::string> redis_key(std::string_view prefix, const l2_key& k) const override {
    return l2_key_string(prefix, k.model, k.rank, 0, k.hash, k.salt);
  }
  std::optional<l2_name_fields> parse_redis_key(std::string_view prefix,
                                                std::string_view key) const override {
    auto f = redis_fields(prefix, key);
    if (!f)
      return std::nullopt;
    l2_name_fields out;
    out.salt = std::move(f->salt);
    out.hash = from_be64(f->chunk_hash);
    out.rank = static_cast<int32_t>(f->kv_rank);
    return out;
  }

  std::optional<object_key_fields> file_fields(std::string_view name) const override {
    auto n = parse_file_name(name);
    if (!n)
      return std::nullopt;
    object_key_fields f; // the model is not in the name
    f.kv_rank = static_cast<uint32_t>(n->rank);
    f.chunk_hash = be64(*n->hash);
    f.salt = std::move(n->salt);
    return f;
  }
  std::optional<std::string> file_name_of(const object_key_fields& f) const override {
    auto k = key_of(f);
    return k ? file_name(*k) : std::nullopt;
  }
  std::optional<object_key_fields> redis_fields(std::string_view prefix,
                                                std::string_view key) const override {
    if (key.substr(0, prefix.size()) != prefix)
      return std::nullopt;
    auto f = parse_key_body(key.substr(prefix.size()));
    if (!f || f->chunk_hash.size() != 8)
      return std::nullopt;
    return f;
  }
  std::optional<std::string> redis_key_of(std::string_view prefix,
                                          const object_key_fields& f) const override {
    auto hash = from_be64(f.chunk_hash);
    if (!hash || f.chunk_hash.size() != 8)
      return std::nullopt;
    return l2_key_string(prefix, f.model, static_cast<int32_t>(f.kv_rank), f.group, *hash,
                         f.salt);
  }

  size_t header_bytes() const override { return l2_header_bytes; }
  void encode_header(const l2_key& k, uint64_t payload, uint8_t* out) const override {
    encode_l2_header(id_of(k), payload, out);
  }
  bool check(const l2_key& k, const uint8_t* head, uint64_t object_bytes,
             uint32_t* payload_at) const override {
    *payload_at = static_cast<uint32_t>(l2_header_bytes);
    return object_bytes >= l2_header_bytes
           && check_l2_header(head, object_bytes, id_of(k)) == l2_header_check::ok;
  }
  bool check_found(const l2_name_fields& f, const uint8_t* head,
                   uint64_t object_bytes) const override {
    l2_object_id id;
    uint64_t payload = 0;
    return object_bytes >= l2_header_bytes && peek_l2_header(head, &id, &payload)
           && object_bytes == payload + l2_header_bytes && f.hash && id.hash == *f.hash
           && id.rank == f.rank;
  }

  bool exclusive() const override { return true; }
  std::string tmp_name(const std::string& final_name) const override {
    return final_name + ".tmp";
  }
  bool is_tmp(std::string_view name) const override { return ends_with(name, ".tmp"); }
  const char* rejected_kind() const override { return "disk_rejected"; }

private:
  static constexpr std::string_view k_suffix = ".kvl2";
  static std::optional<l2_key> key_of(const object_key_fields& f) {
    auto hash = from_be64(f.chunk_hash);
    if (!hash || f.chunk_hash.size() != 8 || f.group != 0)
      return std::nullopt;
    l2_key k;
    k.hash = *hash;
    k.rank = static_cast<int32_t>(f.kv_rank);
    k.salt = f.salt;
    return k;
  }
  static l2_object_id id_of(const l2_key& k) {
    return l2_object_id{k.hash, k.rank, k.fingerprint, k.layout};
  }
};

class lmcache_naming final : public l2_naming {
public:
  std::optional<std::string> file_name(const l2_key& k) const override {
    if (!nameable(k))
      return std::nullopt;
    return lmcache_file_name(key_of(k));
  }
  std::optional<l2_name_fields> parse_file_name(std::string_view name) const override {
    auto f = parse_lmcache_file_name(name);
    if (!f)
      return std::nullopt;
    l2_name_fields out;
    out.salt = std::move(f->salt);
    out.rank = static_cast<int32_t>((f->kv_rank >> 16) & 0xff);
    return out;
  }
  std::optional<std::string> redis_key(std::string_view prefix, const l2_key& k) const override {
    if (!nameable(k))
      return std::nullopt;
    return lmcache_redis_key(prefix, key_of(k));
  }
  std::optional<l2_name_fields> parse_redis_key(std::string_view prefix,
                                                std::string_view key) const override {
    auto f = redis_fields(prefix, key);
    if (!f)
      return std::nullopt;
    l2_name_fields out;
    out.salt = std::move(f->salt);
    out.rank = static_cast<int32_t>((f->kv_rank >> 16) & 0xff);
    return out;
  }

  std::optional<object_key_fields> file_fields(std::string_view name) const override {
    auto f = parse_lmcache_file_name(name);
    if (!f)
      return std::nullopt;
    return object_key_fields{std::move(f->model), f->kv_rank, f->group, std::move(f->chunk_hash),
                             std::move(f->salt)};
  }
  std::optional<std::string> file_name_of(const object_key_fields& f) const override {
    if (!lmcache_nameable(f.model, f.salt) || f.chunk_hash.empty())
      return std::nullopt;
    return lmcache_file_name({f.model, f.kv_rank, f.group, f.chunk_hash, f.salt});
  }
  std::optional<object_key_fields> redis_fields(std::string_view prefix,
                                                std::string_view key) const override {
    if (key.substr(0, prefix.size()) != prefix)
      return std::nullopt;
    return parse_key_body(key.substr(prefix.size()));
  }
  std::optional<std::string> redis_key_of(std::string_view prefix,
                                          const object_key_fields& f) const override {
    if (!lmcache_nameable(f.model, f.salt) || f.chunk_hash.empty())
      return std::nullopt;
    return lmcache_redis_key(prefix, {f.model, f.kv_rank, f.group, f.chunk_hash, f.salt});
  }

  size_t header_bytes() const override { return 0; }
  void encode_header(const l2_key&, uint64_t, uint8_t*) const override {}
  bool check(const l2_key& k, const uint8_t*, uint64_t object_bytes,
             uint32_t* payload_at) const override {
    *payload_at = 0;
    return k.layout != 0 && object_bytes == k.layout;
  }
  bool check_found(const l2_name_fields&, const uint8_t*, uint64_t) const override {
    return true; // no header: a read checks the length it expects
  }

  bool exclusive() const override { return false; }
  std::string tmp_name(const std::string& final_name) const override {
    // The pid keeps two nodes writing one object from sharing a temporary
    // (LMCache's own are <stem>.tmp, in flight on a live node: never touched).
    return final_name + "." + std::to_string(::getpid()) + ".kvstmp";
  }
  bool is_tmp(std::string_view name) const override { return ends_with(name, ".kvstmp"); }
  const char* rejected_kind() const override { return "disk_wrong_size"; }

private:
  static bool nameable(const l2_key& k) {
    return !k.lmcache_hash.empty() && lmcache_nameable(k.model, k.salt);
  }
  static lmcache_object_key key_of(const l2_key& k) {
    return {k.model, lmcache_kv_rank(k.world_size, k.rank), k.group, k.lmcache_hash, k.salt};
  }
};

} // namespace

std::unique_ptr<l2_naming> make_kvsidecar_naming() {
  return std::make_unique<kvsidecar_naming>();
}
std::unique_ptr<l2_naming> make_lmcache_naming() {
  return std::make_unique<lmcache_naming>();
}

} // namespace kvs
