// l2_naming: how one L2 format (l2.format) names, frames and checks an
// object, for every backend that stores it:
//   kvsidecar  files <rank:08x>@<hash:016x>[@<salt>].kvl2 and Redis keys
//              l2_key_string(); each object is l2/object_header.hpp's
//              64-byte header + the payload, checked on every read. The
//              folder is kvsidecar's alone (exclusive()): temporaries and
//              objects that fail their check are removed.
//   lmcache    LMCache 0.5.6's fs and resp adapters' names
//              (l2/lmcache_object_name.hpp); the payload alone, accepted
//              when its length is the layout's. The folder may be shared
//              with LMCache's nodes: another writer's files are found by
//              name and never removed for being odd.
#pragma once

#include "core/object_key.hpp"
#include "l2/l2_backend.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace kvs {

class l2_naming {
public:
  virtual ~l2_naming() = default;

  /// The file name in a folder (no directory); nullopt: not nameable.
  virtual std::optional<std::string> file_name(const l2_key& k) const = 0;
  /// What a file name says; nullopt for a name this format never writes.
  virtual std::optional<l2_name_fields> parse_file_name(std::string_view name) const = 0;
  /// The Redis key, `prefix` in front; nullopt: not nameable.
  virtual std::optional<std::string> redis_key(std::string_view prefix, const l2_key& k) const = 0;
  /// What a Redis key says (its salt), `prefix` in front.
  virtual std::optional<l2_name_fields> parse_redis_key(std::string_view prefix,
                                                        std::string_view key) const = 0;

  /// LMCache's key fields a file name / Redis key carries, and back (GET and
  /// DELETE /cache/objects); nullopt where this format cannot say it.
  virtual std::optional<object_key_fields> file_fields(std::string_view name) const = 0;
  virtual std::optional<std::string> file_name_of(const object_key_fields& f) const = 0;
  virtual std::optional<object_key_fields> redis_fields(std::string_view prefix,
                                                        std::string_view key) const = 0;
  virtual std::optional<std::string> redis_key_of(std::string_view prefix,
                                                  const object_key_fields& f) const = 0;

  /// Bytes written in front of the payload (0: none).
  virtual size_t header_bytes() const = 0;
  virtual void encode_header(const l2_key& k, uint64_t payload, uint8_t* out) const = 0;
  /// `object_bytes` long, starting with `head` (header_bytes() of it): it is
  /// `k`'s object. *payload_at: where the payload starts.
  virtual bool check(const l2_key& k, const uint8_t* head, uint64_t object_bytes,
                     uint32_t* payload_at) const = 0;
  /// A file found at start-up named `f` is a whole object of this format.
  virtual bool check_found(const l2_name_fields& f, const uint8_t* head,
                           uint64_t object_bytes) const = 0;

  /// Only kvsidecar writes the folder: what fails a check is removed, and
  /// nothing appears there behind its back.
  virtual bool exclusive() const = 0;
  /// A temporary of ours for `final_name`, and whether `name` is one.
  virtual std::string tmp_name(const std::string& final_name) const = 0;
  virtual bool is_tmp(std::string_view name) const = 0;
  /// The kind label under which rejected objects are counted.
  virtual const char* rejected_kind() const = 0;
};

std::unique_ptr<l2_naming> make_kvsidecar_naming();
std::unique_ptr<l2_naming> make_lmcache_naming();

} // namespace kvs
