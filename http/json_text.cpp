#include "http/json_text.hpp"

#include "core/hex.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvs {

namespace {

struct cursor {
  std::string_view t;
  size_t i = 0;
  std::string error;

  bool fail(const std::string& what) {
    if (error.empty())
      error = what + " at byte " + std::to_string(i);
    return false;
  }
  void skip_ws() {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r'))
      ++i;
  }
  bool eat(char c) {
    skip_ws();
    if (i < t.size() && t[i] == c) {
      ++i;
      return true;
    }
    return false;
  }

  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool hex4(uint32_t& v) {
    if (i + 4 > t.size())
      return fail("a \\u escape needs four hex digits");
    v = 0;
    for (int k = 0; k < 4; ++k) {
      int h = hex_digit(t[i++]);
      if (h < 0)
        return fail("a \\u escape needs four hex digits");
      v = v * 16 + static_cast<uint32_t>(h);
    }
    return true;
  }

  bool string(std::string& out) {
    skip_ws();
    if (i >= t.size() || t[i] != '"')
      return fail("expected a string");
    ++i;
    while (i < t.size()) {
      char c = t[i++];
      if (c == '"')
        return true;
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= t.size())
        break;
      char e = t[i++];
      switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        uint32_t cp = 0; // GCC 12 -O3 cannot see that hex4 sets it
        if (!hex4(cp))
          return false;
        if (cp >= 0xD800 && cp <= 0xDBFF) { // a surrogate pair
          uint32_t lo = 0;
          if (i + 2 > t.size() || t[i] != '\\' || t[i + 1] != 'u')
            return fail("a lone surrogate in a \\u escape");
          i += 2;
          if (!hex4(lo))
            return false;
          if (lo < 0xDC00 || lo > 0xDFFF)
            return fail("a lone surrogate in a \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return fail("a lone surrogate in a \\u escape");
        }
        utf8(out, cp);
        break;
      }
      default:
        return fail("an unknown escape in a string");
      }
    }
    return fail("an unterminated string");
  }

  bool number(double& out) {
    size_t start = i;
    if (i < t.size() && t[i] == '-')
      ++i;
    if (i >= t.size() || !(t[i] >= '0' && t[i] <= '9'))
      return fail("expected a value");
    if (t[i] == '0')
      ++i;
    else
      while (i < t.size() && t[i] >= '0' && t[i] <= '9')
        ++i;
    if (i < t.size() && t[i] == '.') {
      ++i;
      if (i >= t.size() || !(t[i] >= '0' && t[i] <= '9'))
        return fail("a digit must follow the decimal point");
      while (i < t.size() && t[i] >= '0' && t[i] <= '9')
        ++i;
    }
    if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
      ++i;
      if (i < t.size() && (t[i] == '+' || t[i] == '-'))
        ++i;
      if (i >= t.size() || !(t[i] >= '0' && t[i] <= '9'))
        return fail("a digit must follow the exponent");
      while (i < t.size() && t[i] >= '0' && t[i] <= '9')
        ++i;
    }
    if (i - start > 64)
      return fail("a number longer than 64 characters");
    std::string digits{t.substr(start, i - start)};
    out = std::strtod(digits.c_str(), nullptr);
    return true;
  }

  /// [int, int, ...]: integers only (token ids), exactly representable.
  bool int_array(std::vector<int64_t>& out) {
    ++i; // '['
    skip_ws();
    if (i < t.size() && t[i] == ']') {
      ++i;
      return true;
    }
    for (;;) {
      skip_ws();
      double d;
      size_t at = i;
      if (!number(d))
        return false;
      if (t.substr(at, i - at).find_first_of(".eE") != std::string_view::npos
          || !(d >= -9007199254740992.0 && d <= 9007199254740992.0))
        return fail("an array may hold only integers (at most 2^53)");
      out.push_back(static_cast<int64_t>(d));
      if (eat(','))
        continue;
      if (eat(']'))
        return true;
      return fail("expected ',' or ']'");
    }
  }

  bool literal(std::string_view word) {
    if (t.substr(i, word.size()) != word)
      return fail("expected a value");
    i += word.size();
    return true;
  }

  /// [{...}, {...}]: flat objects (a list of keys), at most json_max_objects.
  bool object_array(std::vector<json_object>& out) {
    ++i; // '['
    for (;;) {
      if (out.size() >= json_max_objects)
        return fail("more than " + std::to_string(json_max_objects) + " objects in an array");
      out.emplace_back();
      if (!object(out.back(), 1))
        return false;
      if (eat(','))
        continue;
      if (eat(']'))
        return true;
      return fail("expected ',' or ']'");
    }
  }

  /// One object; `depth` 1 inside an array (where arrays are refused).
  bool object(json_object& o, int depth) {
    if (!eat('{'))
      return fail("expected a JSON object");
    if (eat('}'))
      return true;
    for (;;) {
      std::string name;
      json_value v;
      if (!string(name))
        return false;
      if (!eat(':'))
        return fail("expected ':'");
      if (!value(v, depth))
        return false;
      if (o.members.count(name))
        return fail("member \"" + name.substr(0, 64) + "\" given twice");
      if (o.members.size() >= json_max_members)
        return fail("more than " + std::to_string(json_max_members) + " members");
      o.members.emplace(std::move(name), std::move(v));
      if (eat(','))
        continue;
      if (eat('}'))
        return true;
      return fail("expected ',' or '}'");
    }
  }

  bool value(json_value& v, int depth) {
    skip_ws();
    if (i >= t.size())
      return fail("expected a value");
    char c = t[i];
    if (c == '"') {
      v.k = json_value::kind::string;
      return string(v.s);
    }
    if (c == '{')
      return fail("nested objects are not accepted");
    if (c == '[') {
      if (depth > 0)
        return fail("arrays inside an array's objects are not accepted");
      size_t at = i + 1;
      while (at < t.size() && (t[at] == ' ' || t[at] == '\t' || t[at] == '\r' || t[at] == '\n'))
        ++at;
      if (at < t.size() && t[at] == '{') {
        v.k = json_value::kind::object_array;
        return object_array(v.objects);
      }
      v.k = json_value::kind::int_array;
      return int_array(v.ints);
    }
    if (c == 't') {
      v.k = json_value::kind::boolean;
      v.b = true;
      return literal("true");
    }
    if (c == 'f') {
      v.k = json_value::kind::boolean;
      return literal("false");
    }
    if (c == 'n') {
      v.k = json_value::kind::null;
      return literal("null");
    }
    v.k = json_value::kind::number;
    return number(v.n);
  }
};

} // namespace

json_object parse_json_object(std::string_view text) {
  json_object o;
  cursor c{text, 0, {}};
  auto done = [&] {
    o.error = std::move(c.error);
    if (!o.error.empty())
      o.members.clear();
    return std::move(o);
  };
  if (!c.object(o, 0))
    return done();
  c.skip_ws();
  if (c.i != text.size())
    c.fail("bytes after the object");
  return done();
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
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
