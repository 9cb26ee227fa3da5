// A strict, non-executing reader for the one kind of Python pickle kvsidecar
// accepts: an LMCache DeviceIPCWrapper as LMCache clients before 0.5.6 sent
// it inside msgpack ext type 1 (`pickle.dumps(wrapper)`, protocols 2-5).
// LMCache 0.5.6 itself sends a data-only msgpack descriptor instead (see
// lmcache_protocol.hpp); this reader keeps older clients, the SGLang seed's
// era among them, working.
//
// It is a small stack machine over an arena of plain values. It knows only
// the opcodes those pickles contain, resolves only whitelisted globals (the
// wrapper classes at their LMCache module paths, torch dtypes, torch.Size and
// the two callables protocol 2 uses for bytes), and never calls anything: a
// "call" of a whitelisted callable is evaluated by the reader itself. Every
// count is capped, so the work and memory are bounded by the input size.
#pragma once

#include "core/tensor_desc.hpp"
#include "core/error.hpp"

#include <cstddef>
#include <string_view>

namespace kvs {

struct pickle_limits {
  size_t max_stack = 256;       ///< values on the stack (marks included)
  size_t max_memo = 1024;       ///< memo slots; a BINPUT index past this is refused
  size_t max_objects = 16384;   ///< values created in total
  size_t max_depth = 16;        ///< container nesting
  size_t max_container = 4096;  ///< elements in one tuple/list/dict
};

/// Decodes a pickled CudaIPCWrapper (torch storage IPC), RawCudaIPCWrapper
/// (driver IPC handle) or CpuShmTensorWrapper (POSIX shm) into a tensor_desc.
/// Error kinds: "pickle_opcode" (an opcode outside the supported set, named
/// with its offset), "pickle_global" (a global not on the whitelist),
/// "pickle_truncated", "pickle_limit", "pickle_malformed" (stack/type misuse),
/// "bad_wrapper" (the object is not a wrapper, or an attribute is missing or
/// mistyped) and "unsupported_wrapper" (VmmCudaIPCWrapper, expandable-segment
/// handles).
expected<tensor_desc> decode_pickled_ipc_wrapper(std::string_view pickle,
                                                 const pickle_limits& limits = {});

} // namespace kvs
