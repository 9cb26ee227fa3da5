// LMCache's gRPC messages <-> the frames of its ZeroMQ transport, in three
// parts with one job each:
//   grpc_request_frames.hpp  a request -> exactly the frames a ZeroMQ client
//                            of the same LMCache release sends, so the engine
//                            bridge decodes, checks and routes it on the one
//                            path every ZeroMQ request takes (no op is
//                            implemented twice); one row per message over
//                            one parse -> check -> key -> frames step;
//   grpc_reply.hpp           the reply body the actors encode for ZeroMQ
//                            (msgpack) -> the RPC's response message;
//   grpc_kv_event_batch.hpp  a subscribe_kv_events batch -> KVEventBatch.
// This header is all three, for the server and the tests.
#pragma once

#include "lmcache_grpc/grpc_kv_event_batch.hpp"
#include "lmcache_grpc/grpc_reply.hpp"
#include "lmcache_grpc/grpc_request_frames.hpp"
