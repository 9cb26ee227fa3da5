#include "gpu/device_uuid.hpp"

#include <cctype>

namespace kvs {

std::string format_device_uuid(const device_uuid_bytes& b) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  s.reserve(36);
  for (size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s.push_back(hex[b[i] >> 4]);
    s.push_back(hex[b[i] & 0xf]);
  }
  return s;
}

expected<device_uuid_bytes> parse_device_uuid(const std::string& text) {
  auto bad = [&] { return make_error("bad_uuid", "'" + text + "' is not a GPU UUID"); };
  device_uuid_bytes out{};
  size_t i = 0;
  if (text.size() >= 4 && std::tolower(static_cast<unsigned char>(text[0])) == 'g' &&
      std::tolower(static_cast<unsigned char>(text[1])) == 'p' &&
      std::tolower(static_cast<unsigned char>(text[2])) == 'u' && text[3] == '-')
    i = 4;
  size_t nibbles = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '-') continue;
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else return bad();
    if (nibbles >= 32) return bad();
    uint8_t& byte = out[nibbles / 2];
    byte = (nibbles % 2 == 0) ? static_cast<uint8_t>(v << 4) : static_cast<uint8_t>(byte | v);
    ++nibbles;
  }
  if (nibbles != 32) return bad();
  return out;
}

} // namespace kvs
