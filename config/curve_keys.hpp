// CURVE key files for [security] (Z85 text, as zmq's zcert files or raw).
//
// A key file holds one key: either the 40 Z85 characters alone (whitespace
// around them ignored), or zmq's zcert format, where the line
// `secret-key = "<40 Z85>"` (secret) or `public-key = "<40 Z85>"` (public)
// is used and `#` comments and other lines are ignored.
#pragma once

#include "core/error.hpp"

#include <optional>
#include <string>
#include <vector>

namespace kvs {

/// Decodes 40 Z85 characters into 32 bytes; nullopt when malformed.
std::optional<std::string> z85_decode_key(const std::string& z85);

/// Reads the key of one file: `secret` picks zcert's secret-key line, else
/// public-key. Returns the 32-byte key, or error kind "io" (unreadable) or
/// "bad_key" (no key in it), the detail naming the file.
expected<std::string> read_curve_key(const std::string& path, bool secret);

/// Every public key in `dir` (regular files, sorted by name; names starting
/// with '.' skipped), or the error of the first bad one (read_curve_key's,
/// or "io" when `dir` cannot be opened).
expected<std::vector<std::string>> read_curve_public_keys(const std::string& dir);

} // namespace kvs
