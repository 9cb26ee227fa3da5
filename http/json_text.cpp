#include "http/json_text.hpp"

#include <simdjson.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvs {

namespace {

namespace od = simdjson::ondemand;

// 2^53: the largest integer a double (and so LMCache's Python side) holds exactly.
constexpr int64_t max_exact_int = int64_t{1} << 53;

/// simdjson's words for `e`, without the full stop (" at byte N" follows).
std::string message(simdjson::error_code e) {
  std::string m = simdjson::error_message(e);
  if (!m.empty() && m.back() == '.')
    m.pop_back();
  return m;
}

/// `member "name": ` (the name cut at 64 bytes) before what was wrong in it.
std::string in_member(std::string_view name) {
  return "member \"" + std::string{name.substr(0, 64)} + "\": ";
}

/// One body's read: simdjson's On Demand walks it, this checks the shape
/// (flat objects, arrays of integers or of flat objects) and the limits, and
/// words a failure as what was wrong, in which member, at which byte.
struct reader {
  od::document& doc;
  const char* base;
  std::string error;

  bool fail(std::string what) {
    if (!error.empty())
      return false;
    error = std::move(what);
    // Where the walk stopped; simdjson knows it only while the document
    // is readable (not after a failed first pass).
    const char* at = nullptr;
    if (!doc.current_location().get(at) && at >= base)
      error += " at byte " + std::to_string(at - base);
    return false;
  }
  bool fail(simdjson::error_code e, std::string_view member = {}) {
    return fail(member.empty() ? message(e) : in_member(member) + message(e));
  }

  /// simdjson refuses a number beyond a double's range (1e400); it reads
  /// as +-infinity instead, so the route can say the value must be finite.
  static bool overflow(od::value& v, double& out) {
    std::string_view tok = v.raw_json_token();
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t' || tok.back() == '\n'
                            || tok.back() == '\r'))
      tok.remove_suffix(1);
    if (tok.empty() || tok.size() > 64)
      return false;
    std::string digits{tok};
    char* end = nullptr;
    errno = 0;
    double d = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size() || errno != ERANGE || std::isfinite(d))
      return false;
    out = d;
    return true;
  }

  /// An integer of a token-id list: exactly representable in a double.
  bool integer(od::value& v, std::vector<int64_t>& out, std::string_view name) {
    od::number_type nt;
    int64_t i = 0;
    // unsigned_integer is above 2^63, so above 2^53 too.
    if (v.get_number_type().get(nt) || nt != od::number_type::signed_integer
        || v.get_int64().get(i) || i < -max_exact_int || i > max_exact_int)
      return fail(in_member(name) + "an array may hold only integers (at most 2^53)");
    out.push_back(i);
    return true;
  }

  /// [int, ...] (token ids) or [{...}, ...] (flat objects, at most
  /// json_max_objects): the first element decides which; an empty array is
  /// an empty list of integers.
  bool array(od::value& v, json_value& out, std::string_view name, int depth) {
    if (depth > 0)
      return fail("arrays inside an array's objects are not accepted");
    od::array a;
    if (auto e = v.get_array().get(a))
      return fail(e, name);
    out.k = json_value::kind::int_array;
    bool first = true;
    for (auto r : a) {
      od::value el;
      od::json_type t;
      if (auto e = r.get(el))
        return fail(e, name);
      if (auto e = el.type().get(t))
        return fail(e, name);
      if (first && t == od::json_type::object)
        out.k = json_value::kind::object_array;
      first = false;
      if (out.k == json_value::kind::int_array) {
        if (!integer(el, out.ints, name))
          return false;
        continue;
      }
      if (t != od::json_type::object)
        return fail(in_member(name) + "an array of objects holds only objects");
      if (out.objects.size() >= json_max_objects)
        return fail("more than " + std::to_string(json_max_objects) + " objects in an array");
      od::object o;
      if (auto e = el.get_object().get(o))
        return fail(e, name);
      out.objects.emplace_back();
      if (!object(o, out.objects.back(), 1))
        return false;
    }
    return true;
  }

  bool value(od::value& v, json_value& out, std::string_view name, int depth) {
    od::json_type t;
    if (auto e = v.type().get(t))
      return fail(e, name);
    switch (t) {
    case od::json_type::string: {
      std::string_view s;
      if (auto e = v.get_string().get(s))
        return fail(e, name);
      out.k = json_value::kind::string;
      out.s = s;
      return true;
    }
    case od::json_type::number:
      out.k = json_value::kind::number;
      if (auto e = v.get_double().get(out.n))
        return overflow(v, out.n) || fail(e, name);
      return true;
    case od::json_type::boolean:
      out.k = json_value::kind::boolean;
      if (auto e = v.get_bool().get(out.b))
        return fail(e, name);
      return true;
    case od::json_type::null: {
      bool is = false;
      if (auto e = v.is_null().get(is))
        return fail(e, name);
      if (!is)
        return fail(simdjson::N_ATOM_ERROR, name);
      out.k = json_value::kind::null;
      return true;
    }
    case od::json_type::object:
      return fail(in_member(name) + "nested objects are not accepted");
    case od::json_type::array:
      return array(v, out, name, depth);
    }
    return fail("expected a value");
  }

  /// One object; `depth` 1 inside an array (where arrays are refused).
  bool object(od::object& o, json_object& out, int depth) {
    for (auto r : o) {
      od::field f;
      if (auto e = std::move(r).get(f))
        return fail(e);
      std::string_view key;
      if (auto e = f.unescaped_key().get(key))
        return fail(e);
      std::string name{key};
      if (out.members.count(name))
        return fail("member \"" + name.substr(0, 64) + "\" given twice");
      if (out.members.size() >= json_max_members)
        return fail("more than " + std::to_string(json_max_members) + " members");
      json_value v;
      if (!value(f.value(), v, name, depth))
        return false;
      out.members.emplace(std::move(name), std::move(v));
    }
    return true;
  }
};

} // namespace

json_object parse_json_object(std::string_view text) {
  // One parser and one padded copy of the body a thread, kept: simdjson
  // reads SIMDJSON_PADDING bytes past the end, and reusing both saves an
  // allocation per body.
  thread_local od::parser parser;
  thread_local std::string padded;
  padded.assign(text);
  padded.resize(text.size() + simdjson::SIMDJSON_PADDING, ' ');
  json_object o;
  // The ends first: simdjson words a missing '}' and bytes after it alike
  // ("ended early"), this tells them apart.
  size_t first = text.find_first_not_of(" \t\r\n");
  size_t last = text.find_last_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] != '{') {
    o.error = "expected a JSON object at byte " + std::to_string(first);
    return o;
  }
  if (last != std::string_view::npos && text[last] != '}') {
    o.error = "the object does not end where the body does (a missing '}' or bytes after it)"
              " at byte "
              + std::to_string(last);
    return o;
  }
  od::document doc;
  if (auto e = parser.iterate(padded.data(), text.size(), padded.size()).get(doc)) {
    o.error = message(e); // stage 1 failed: simdjson knows no byte here
    return o;
  }
  reader r{doc, padded.data(), {}};
  auto done = [&] {
    o.error = std::move(r.error);
    if (!o.error.empty())
      o.members.clear();
    return std::move(o);
  };
  od::json_type t;
  if (auto e = doc.type().get(t))
    return r.fail(e), done();
  if (t != od::json_type::object)
    return r.fail("expected a JSON object"), done();
  od::object obj;
  if (auto e = doc.get_object().get(obj))
    return r.fail(e), done();
  if (!r.object(obj, o, 0))
    return done();
  // A location left means tokens after the object's '}'.
  const char* rest = nullptr;
  if (!doc.current_location().get(rest))
    r.fail("bytes after the object");
  return done();
}

namespace {

/// The bytes of a UTF-8 sequence led by `lead` (1 for a stray byte).
size_t utf8_length(unsigned char lead) {
  return lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
}

} // namespace

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  // JSON is UTF-8 (simdjson and Python refuse anything else), and answers
  // quote what a client sent (a method, a path): a byte that is not UTF-8
  // becomes U+FFFD.
  bool utf8 = simdjson::validate_utf8(s.data(), s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (!utf8 && static_cast<unsigned char>(c) >= 0x80) {
      size_t n = utf8_length(static_cast<unsigned char>(c));
      if (n > 1 && i + n <= s.size() && simdjson::validate_utf8(s.data() + i, n)) {
        out.append(s.data() + i, n);
        i += n - 1;
      } else {
        out += "\\ufffd";
      }
      continue;
    }
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
        out += buf;
      } else {
        out += c;
      }
    }
  }
  out += '"';
  return out;
}

void json_writer::member(std::string_view key) {
  if (!first_)
    out_ += ',';
  first_ = false;
  if (!key.empty()) {
    out_ += json_quote(key);
    out_ += ':';
  }
}

json_writer& json_writer::begin_object(std::string_view key) {
  member(key);
  out_ += '{';
  first_ = true;
  return *this;
}
json_writer& json_writer::end_object() {
  out_ += '}';
  first_ = false;
  return *this;
}
json_writer& json_writer::begin_array(std::string_view key) {
  member(key);
  out_ += '[';
  first_ = true;
  return *this;
}
json_writer& json_writer::end_array() {
  out_ += ']';
  first_ = false;
  return *this;
}
json_writer& json_writer::str(std::string_view key, std::string_view v) {
  member(key);
  out_ += json_quote(v);
  return *this;
}
json_writer& json_writer::num(std::string_view key, double v) {
  member(key);
  if (!std::isfinite(v)) {
    out_ += "null";
    return *this;
  }
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s{buf};
  // Python reads 1 as int; keep floats floats (LMCache's *_gb are floats).
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  out_ += s;
  return *this;
}
json_writer& json_writer::integer(std::string_view key, uint64_t v) {
  member(key);
  out_ += std::to_string(v);
  return *this;
}
json_writer& json_writer::boolean(std::string_view key, bool v) {
  member(key);
  out_ += v ? "true" : "false";
  return *this;
}
json_writer& json_writer::null(std::string_view key) {
  member(key);
  out_ += "null";
  return *this;
}
json_writer& json_writer::raw(std::string_view key, std::string_view json) {
  member(key);
  out_ += json;
  return *this;
}

} // namespace kvs
