// Reads a whole file into memory: the config file, CURVE key files and the
// gRPC endpoint's TLS PEM files. Standard library only.
#pragma once

#include "core/error.hpp"

#include <fstream>
#include <sstream>
#include <string>

namespace kvs {

/// The file's bytes; error kind "io" naming the path when it cannot be read.
inline expected<std::string> read_text_file(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in)
    return make_error("io", "cannot read \"" + path + "\"");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

} // namespace kvs
