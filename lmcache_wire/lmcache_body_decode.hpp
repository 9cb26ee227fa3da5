// The body decoder's entries (internal to lmcache_wire/): one per request
// shape, named by the op table's rows (lmcache_ops.cpp). `op_args` is the
// argument frames of one request read by position; it is defined in
// lmcache_body_decode.cpp, the only place that reads them. No msgpack here.
#pragma once

#include "core/error.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <string_view>
#include <vector>

namespace kvs {
struct mp_op_row;
}

namespace kvs::lmcache_wire {

class op_args;

/// Decodes `frames` (the arguments, arity already checked) with `row`'s
/// decoder into `body`. Error kind "bad_field"; detail names the argument.
status decode_body(const mp_op_row& row, const std::vector<std::string_view>& frames,
                   mp_request_body& body);

namespace body {
status register_kv_cache(const op_args&, mp_request_body&);
template <class Req> status instance_only(const op_args&, mp_request_body&);
template <class Req> status request_id_only(const op_args&, mp_request_body&);
template <class Req> status key_instance(const op_args&, mp_request_body&);
template <class Req> status none(const op_args&, mp_request_body&);
status store(const op_args&, mp_request_body&);
status retrieve(const op_args&, mp_request_body&);
status lookup(const op_args&, mp_request_body&);
status free_lookup_locks(const op_args&, mp_request_body&);
status wait_prefetch_status(const op_args&, mp_request_body&);
status clear(const op_args&, mp_request_body&);
status ping(const op_args&, mp_request_body&);
status register_engine_driven(const op_args&, mp_request_body&);
status prepare_store(const op_args&, mp_request_body&);
status commit_store(const op_args&, mp_request_body&);
status negotiate_chunk_size(const op_args&, mp_request_body&);
status server_module_call(const op_args&, mp_request_body&);
status report_block_allocation(const op_args&, mp_request_body&);
} // namespace body

} // namespace kvs::lmcache_wire
