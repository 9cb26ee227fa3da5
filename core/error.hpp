// The one error model of kvsidecar: every fallible function below the actor
// layer returns `expected<T>` (a value or a `kvs::error`), never throws
// across a module boundary and never reports through out-parameters.
// Actors turn a `kvs::error` into a `caf::error` (actors/caf_error.hpp) so a
// failed request/response fails through CAF's error path, not `ok=false`.
//
// This header has no dependencies beyond the standard library on purpose:
// config/, gpu/, l2/, cache/ and messages/ use it without pulling CAF in.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kvs {

/// What went wrong and where, ready for one log line or one wire reply.
struct error {
  /// Short machine-friendly class of problem, used to count and to log once
  /// per kind ("unknown_tag", "bad_field", "layout", "shm_truncated", ...).
  std::string kind;
  /// Human detail naming the place: "event 3: field 'block_size': expected
  /// int, got str".
  std::string detail;
};

inline error make_error(std::string kind, std::string detail) {
  return error{std::move(kind), std::move(detail)};
}

/// "kind: detail" (or just the one that is set), for log lines and replies.
inline std::string to_string(const error& e) {
  if (e.detail.empty())
    return e.kind;
  if (e.kind.empty())
    return e.detail;
  return e.kind + ": " + e.detail;
}

/// A value or the error that prevented it (C++17 has no std::expected).
template <class T>
class expected {
public:
  // Implicit on purpose (return a value or an error). By reference, not by
  // value: a large result (a decoded batch) is moved once, into place.
  expected(T&& value) : v_(std::in_place_index<0>, std::move(value)) {} // NOLINT
  expected(const T& value) : v_(std::in_place_index<0>, value) {}       // NOLINT
  expected(error&& err) : v_(std::in_place_index<1>, std::move(err)) {} // NOLINT
  expected(const error& err) : v_(std::in_place_index<1>, err) {}       // NOLINT

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const error& error_value() const { return std::get<1>(v_); }
  error& error_value() { return std::get<1>(v_); }

private:
  std::variant<T, error> v_;
};

/// For operations that only succeed or fail.
struct unit {};
template <>
class expected<void> {
public:
  expected() = default;
  expected(error err) : err_(std::move(err)), ok_(false) {} // NOLINT

  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const error& error_value() const { return err_; }
  error& error_value() { return err_; }

private:
  error err_;
  bool ok_ = true;
};

using status = expected<void>;

} // namespace kvs
