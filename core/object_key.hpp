// One cache object as LMCache's ObjectKey names it (its EncodedObjectKey on
// the HTTP API): what GET|DELETE /cache/objects list and delete in L2, and
// what an L2 backend's object names encode (l2/l2_naming.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace kvs {

struct object_key_fields {
  std::string model;      ///< model_name ("" where a name does not carry it)
  uint32_t kv_rank = 0;   ///< LMCache's packed kv_rank; kvsidecar's layout: the TP rank
  uint32_t group = 0;     ///< object_group_id
  std::string chunk_hash; ///< raw bytes (kvsidecar's 64-bit hash: 8 bytes, big-endian)
  std::string salt;       ///< cache_salt
};

} // namespace kvs
