// The value-or-error every gpu/ function returns instead of throwing: the
// gpu-transfer actor turns an error into one log line and ok=false on the
// wire, so nothing here may unwind across an actor boundary.
#pragma once

#include "messages/wire_error.hpp"

#include <string>
#include <utility>
#include <variant>

namespace kvs {

/// Error classes used by gpu/ (wire_error::kind):
///   "layout"       registration shape/stride/dtype we cannot handle
///   "unsupported"  a valid layout or engine this build does not copy
///   "bad_request"  a copy request that does not fit the registration
///   "open"         shm_open/mmap/cudaIpcOpenMemHandle and friends
///   "shm_truncated" host backend: the engine shrank a registered shared-memory
///                  object and a copy touched a page it no longer backs
///   "cuda"         any other CUDA runtime failure
inline wire_error gpu_error(std::string kind, std::string detail) {
  return wire_error{std::move(kind), std::move(detail)};
}

template <class T>
class gpu_result {
public:
  gpu_result(T value) : v_(std::move(value)) {}           // NOLINT: implicit on purpose
  gpu_result(wire_error err) : v_(std::move(err)) {}      // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const wire_error& error() const { return std::get<1>(v_); }

private:
  std::variant<T, wire_error> v_;
};

/// For operations that only succeed or fail.
struct gpu_ok {};
using gpu_status = gpu_result<gpu_ok>;

} // namespace kvs
