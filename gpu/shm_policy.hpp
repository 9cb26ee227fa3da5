// Which POSIX shared-memory objects a client may register (host backend).
//
// A client names objects by string; without these checks any client that
// reaches the cache endpoint could make the sidecar map whatever its user
// can open (another tenant's pools, glibc's sem.* semaphores) and copy
// bytes between them. The registry applies both checks to every host_shm
// tensor before anything is mapped; the reasons are sent to the log.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

/// `name` without its one leading '/', as the kernel sees it under /dev/shm.
std::string_view shm_bare_name(std::string_view name);

/// Why `name` may not be registered (kind "shm_name", the reason in
/// `detail`), or success when it may. Refused: empty,
/// longer than NAME_MAX, an embedded NUL or other control character, a '/'
/// after the leading one, "." / "..", glibc's semaphores ("sem.*"), and any
/// name that starts with none of `allow_prefixes` (compared without the
/// leading '/'; an empty prefix allows every other name).
status check_shm_name(std::string_view name, const std::vector<std::string>& allow_prefixes);

/// Why the object `name` may not be registered by a client running as
/// `uid` (kind "shm_owner"), or success: it must be a regular object owned by `uid`. Opens it
/// read-only (glibc adds O_NOFOLLOW) and closes it again.
status check_shm_owner(const std::string& name, uint32_t uid);

} // namespace kvs
