// subscribe_kv_events (LMCache 0.5.6's kv_event_stream): the request and the
// KVEventBatch frames of the stream (lmcache/v1/multiprocess/custom_types.py
// KVEventRecord / KVEventBatch; transport/base.py subscribe_kv_events).
//
// The op is routed by name only (no legacy id); its op-table row is
// `streamed` (lmcache_ops.cpp), which the engine bridge opens. Arguments: instance_id: int,
// model_name: str, cursor: int (>= 0), max_events: int (1..1024). A batch is
// a msgpack map {enabled, incarnation, next_cursor, lost, events}; a record
// {seq, kind "stored"|"removed", medium "CPU", model_name, block_hashes:
// [bin], parent_block_hash: bin|nil, token_ids: [int]}. kvsidecar's chunk
// hashes are 64-bit; on this stream each is its 8 bytes, big-endian.
#pragma once

#include "cache/kv_event_log.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct subscribe_kv_events_req {
  int64_t instance_id = 0;
  std::string model_name;
  int64_t cursor = 0;
  int64_t max_events = 0;
};

/// The four argument frames (after uid and op). Errors: "arity", "bad_arg".
expected<subscribe_kv_events_req>
decode_subscribe_kv_events(const std::vector<std::string_view>& args);

/// One KVEventBatch, as msgspec encodes the dataclass.
std::string encode_kv_event_batch(const kv_event_batch_out& b);

} // namespace kvs
