// GPU identity by UUID. The engine names its device by UUID because
// ordinals differ between processes (CUDA_VISIBLE_DEVICES). torch prints
// the bare form "8d2b0dbd-6c30-..." (str(get_device_properties(i).uuid)),
// nvidia-smi the "GPU-8d2b0dbd-..." form; both are accepted.
#pragma once

#include "core/error.hpp"

#include <array>
#include <cstdint>
#include <string>

namespace kvs {

using device_uuid_bytes = std::array<uint8_t, 16>;

/// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower case (torch's form).
std::string format_device_uuid(const device_uuid_bytes& b);

/// Parses either form (optional case-insensitive "GPU-" prefix, dashes
/// optional, hex in any case). Error kind "bad_uuid" for anything else,
/// e.g. MIG UUIDs.
expected<device_uuid_bytes> parse_device_uuid(const std::string& text);

} // namespace kvs
