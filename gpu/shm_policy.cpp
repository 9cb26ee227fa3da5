#include "gpu/shm_policy.hpp"

#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvs {

std::string_view shm_bare_name(std::string_view name) {
  if (!name.empty() && name.front() == '/')
    name.remove_prefix(1);
  return name;
}

namespace {

// The policy's two error kinds: the name itself, or the object behind it.
error refused(std::string why) { return make_error("shm_name", std::move(why)); }
error not_owned(std::string why) { return make_error("shm_owner", std::move(why)); }

} // namespace

status check_shm_name(std::string_view name, const std::vector<std::string>& allow_prefixes) {
  auto bare = shm_bare_name(name);
  if (bare.empty())
    return refused("empty shared-memory name");
  if (bare.size() > NAME_MAX)
    return refused("shared-memory name of " + std::to_string(bare.size()) + " bytes (at most "
                   + std::to_string(NAME_MAX) + ")");
  for (unsigned char c : bare) {
    if (c == 0)
      return refused("shared-memory name contains a NUL byte");
    if (c < 0x20 || c == 0x7f)
      return refused("shared-memory name contains a control character");
    if (c == '/')
      return refused("shared-memory name contains '/' after the leading one");
  }
  if (bare == "." || bare == "..")
    return refused("shared-memory name is '.' or '..'");
  if (bare.rfind("sem.", 0) == 0)
    return refused("shared-memory name starts with 'sem.' (POSIX semaphores are never "
                   "registered)");
  for (auto& p : allow_prefixes)
    if (bare.rfind(shm_bare_name(p), 0) == 0)
      return {};
  std::string list;
  for (auto& p : allow_prefixes)
    list += (list.empty() ? "'" : ", '") + p + "'";
  return refused("shared-memory name does not start with an allowed prefix "
                 "(cache.shm_allow_prefixes = [" + list + "])");
}

status check_shm_owner(const std::string& name, uint32_t uid) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0)
    return not_owned("shm_open: " + std::string{std::strerror(errno)});
  struct stat st {};
  const int rc = fstat(fd, &st);
  const int e = errno;
  close(fd);
  if (rc != 0)
    return not_owned("fstat: " + std::string{std::strerror(e)});
  if (!S_ISREG(st.st_mode))
    return not_owned("not a regular shared-memory object");
  if (st.st_uid != uid)
    return not_owned("owned by uid " + std::to_string(st.st_uid) + ", the client runs as uid "
                     + std::to_string(uid));
  return {};
}

} // namespace kvs
