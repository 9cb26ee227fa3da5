// The error every wire decoder returns instead of throwing: what was wrong
// and where, ready for one log line.
#pragma once

#include <string>

namespace kvs {

struct wire_error {
  /// Short machine-friendly class of problem, used to count and to log once
  /// per kind ("unknown_tag", "bad_field", "not_a_batch", "arity", ...).
  std::string kind;
  /// Human detail naming the place: "event 3: field 'block_size': expected
  /// int, got str".
  std::string detail;
};

} // namespace kvs
