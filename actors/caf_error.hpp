// How a kvs::error crosses an actor boundary: a request whose handler fails
// answers with a caf::error of category "kvs" whose context carries the
// kind and the detail, and the requester gets the same kvs::error back with
// from_caf_error. Errors CAF raises itself (timeouts, dead actors) come back
// with kind "actor" and CAF's own rendering as detail.
#pragma once

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

#include "core/error.hpp"

namespace kvs {

/// The caf::error category of every kvs::error.
constexpr caf::atom_value kvs_error_category = caf::atom("kvs");

inline caf::error to_caf_error(const error& e) {
  return caf::error{1, kvs_error_category, caf::make_message(e.kind, e.detail)};
}

inline caf::error to_caf_error(std::string kind, std::string detail) {
  return to_caf_error(error{std::move(kind), std::move(detail)});
}

inline error from_caf_error(const caf::error& e) {
  if (e && e.category() == kvs_error_category && e.context().match_elements<std::string, std::string>())
    return error{e.context().get_as<std::string>(0), e.context().get_as<std::string>(1)};
  return error{"actor", caf::to_string(e)};
}

} // namespace kvs
