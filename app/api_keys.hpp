// The HTTP API keys, gathered as LMCache 0.5.7 gathers them
// (lmcache/security/api_key.py load_service_api_keys, used by
// `lmcache server --api-key-file`): every file of http.api_key_files (its
// repeatable --api-key-file), then the file named by LMCACHE_API_KEY_FILE
// (else the legacy LMCACHE_HTTP_API_KEY_FILE), then the value of
// LMCACHE_API_KEY (else LMCACHE_HTTP_API_KEY); empty variables count as
// unset. All of them are accepted at once, so a key is rotated by adding
// the new one, moving clients, then removing the old. A key file holds one
// key on one line (surrounding whitespace stripped); an empty or
// multi-line file, or one that cannot be read, fails the start with its
// path, as LMCache's server refuses to start.
#pragma once

#include "core/error.hpp"

#include <functional>
#include <string>
#include <vector>

namespace kvs {

/// Reads an environment variable; nullptr when unset.
using env_lookup = std::function<const char*(const char*)>;

/// The keys in LMCache's order (files, environment file, environment value).
expected<std::vector<std::string>> load_api_keys(const std::vector<std::string>& files,
                                                 const env_lookup& env);

} // namespace kvs
