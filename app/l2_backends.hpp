// The L2 backends [l2] enables, opened from their config sections, in
// lookup order. A new backend: its own files in l2/, its config section
// (config/section_l2.cpp), an opener and one registration line in
// app/l2_backends.cpp.
#pragma once

#include "config/config.hpp"
#include "core/error.hpp"
#include "l2/l2_backend.hpp"

#include <memory>
#include <vector>

namespace kvs {

/// Every enabled backend, opened; an error naming the key of the one that
/// cannot start (an unusable disk path).
expected<std::vector<std::shared_ptr<l2_backend>>> open_l2_backends(const l2_config& cfg);

} // namespace kvs
