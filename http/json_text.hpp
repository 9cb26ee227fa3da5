// json_text: the small JSON the HTTP API reads and writes.
//
// Reading: LMCache's request bodies are flat objects ({"tier": "l1",
// "force": false}, {"limit_gb": 1.5}, {"token_ids": [1, 2, ...]}, and
// DELETE /cache/objects' {"keys": [{"chunk_hash_hex": ..., ...}, ...]});
// parse_json_object reads exactly that -- an object of strings, numbers,
// booleans, nulls, arrays of integers and arrays of such flat objects
// (one level: no arrays inside them), at most json_max_members members an
// object and json_max_objects objects an array -- and refuses anything else
// (deeper nesting, other arrays, trailing bytes, bad escapes) naming what
// and where (the member and the byte; simdjson's first pass -- an unclosed
// string, an unescaped control character, bytes that are not UTF-8 -- knows
// no byte). simdjson's On Demand reads it (2-12x the hand-written reader it
// replaced: BENCHMARKS.md, "JSON for the HTTP API"), one parser kept per
// thread; simdjson stays out of this header. Pure; fuzzed
// (tests/fuzz/fuzz_http_admin).
//
// Writing: json_writer appends members to an object or array with the
// string escaping JSON needs; nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

inline constexpr size_t json_max_members = 64;
inline constexpr size_t json_max_objects = 1024;

struct json_object;

struct json_value {
  enum class kind { null, boolean, number, string, int_array, object_array } k = kind::null;
  bool b = false;
  double n = 0;
  std::string s;
  std::vector<int64_t> ints; ///< int_array: integers in [-2^53, 2^53]
  std::vector<json_object> objects; ///< object_array: flat objects
};

struct json_object {
  std::map<std::string, json_value, std::less<>> members;
  /// Empty when parsed; else what was wrong and at which byte.
  std::string error;
  const json_value* get(std::string_view name) const {
    auto i = members.find(name);
    return i == members.end() ? nullptr : &i->second;
  }
};

/// Parses `text` as one flat JSON object (whitespace around it allowed).
json_object parse_json_object(std::string_view text);

/// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

/// Builds one JSON value: begin_object/begin_array, then members, then end.
/// Keys and string values are escaped; numbers are written as given.
class json_writer {
public:
  json_writer& begin_object(std::string_view key = {});
  json_writer& end_object();
  json_writer& begin_array(std::string_view key = {});
  json_writer& end_array();
  json_writer& str(std::string_view key, std::string_view v);
  json_writer& num(std::string_view key, double v);
  json_writer& integer(std::string_view key, uint64_t v);
  json_writer& boolean(std::string_view key, bool v);
  json_writer& null(std::string_view key);
  /// Already-encoded JSON (a nested document).
  json_writer& raw(std::string_view key, std::string_view json);
  std::string take() {
    return std::move(out_);
  }

private:
  void member(std::string_view key);
  std::string out_;
  bool first_ = true;
};

} // namespace kvs
