// Faulting a mapping's pages in without writing a byte: one helper for L1
// (cache/slot_pool) and the engine pools the host backend maps
// (gpu/host_backend), so the kernel check lives in one place.
#pragma once

#include <cerrno>
#include <cstddef>
#include <sys/mman.h>

namespace kvs {

/// MADV_POPULATE_WRITE (Linux 5.14) over [addr, addr + len): fills the page
/// tables writable, allocating only pages nobody has backed yet. Returns 0,
/// or the errno: EINVAL when the kernel (or this build's headers) does not
/// know the advice, EFAULT for a page a shared object no longer backs (it
/// was shrunk; never SIGBUS here), ENOMEM for a shortage.
inline int populate_write(void* addr, size_t len) {
#ifdef MADV_POPULATE_WRITE
  return ::madvise(addr, len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
#else
  (void)addr;
  (void)len;
  return EINVAL;
#endif
}

} // namespace kvs
