// Strict pickle reader for LMCache's legacy DeviceIPCWrapper pickles. See
// pickle_reader.hpp for what is accepted and why; the opcode semantics follow
// CPython's Lib/pickle.py (_Unpickler.load_*).
#include "lmcache_wire/pickle_reader.hpp"
#include "msgpack/utf8.hpp"

#include "lmcache_wire/tensor_view.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvs {
namespace {

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

enum class vt : uint8_t {
  none, boolean, integer, floating, str, bytes, tuple, list, dict,
  dtype,    ///< a torch dtype global (name in `s`)
  callable, ///< a whitelisted callable global (`sub` = callable_id)
  klass,    ///< a whitelisted wrapper class (`sub` = wrapper_class)
  object,   ///< an instance of a wrapper class; `items` = state key/value pairs
};

const char* vt_name(vt t) {
  switch (t) {
    case vt::none: return "None";
    case vt::boolean: return "bool";
    case vt::integer: return "int";
    case vt::floating: return "float";
    case vt::str: return "str";
    case vt::bytes: return "bytes";
    case vt::tuple: return "tuple";
    case vt::list: return "list";
    case vt::dict: return "dict";
    case vt::dtype: return "torch.dtype";
    case vt::callable: return "callable";
    case vt::klass: return "class";
    case vt::object: return "object";
  }
  return "?";
}

enum class callable_id : uint8_t { torch_size, codecs_encode, builtins_bytes };
enum class wrapper_class : uint8_t { cuda, cuda_raw, cuda_vmm, cpu_shm };

struct value {
  vt type = vt::none;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;               ///< str / bytes payload; dtype or class name
  std::vector<uint32_t> items; ///< tuple/list elements; dict and object: key, value, key, value...
  uint8_t sub = 0;             ///< callable_id or wrapper_class
  uint32_t depth = 0;          ///< container nesting below this value
};

// ---------------------------------------------------------------------------
// Whitelist
// ---------------------------------------------------------------------------

struct global_entry {
  const char* module;
  const char* name;
  vt type;
  uint8_t sub;
};

// Module paths the wrapper classes have had: custom_types (<= 0.3.x),
// platform.{cuda,cpu} (0.4.x, the SGLang seed's era), platform.devices.*
// (0.5.x, which no longer pickles but costs nothing to accept).
constexpr global_entry k_globals[] = {
    {"lmcache.v1.multiprocess.custom_types", "CudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda)},
    {"lmcache.v1.platform.cuda.ipc_wrapper", "CudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda)},
    {"lmcache.v1.platform.devices.cuda.ipc_wrapper", "CudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda)},
    {"lmcache.v1.multiprocess.custom_types", "RawCudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda_raw)},
    {"lmcache.v1.platform.cuda.ipc_wrapper", "RawCudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda_raw)},
    {"lmcache.v1.platform.devices.cuda.ipc_wrapper", "RawCudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda_raw)},
    {"lmcache.v1.platform.cuda.ipc_wrapper", "VmmCudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda_vmm)},
    {"lmcache.v1.platform.devices.cuda.ipc_wrapper", "VmmCudaIPCWrapper", vt::klass, uint8_t(wrapper_class::cuda_vmm)},
    {"lmcache.v1.platform.cpu.shm", "CpuShmTensorWrapper", vt::klass, uint8_t(wrapper_class::cpu_shm)},
    {"lmcache.v1.platform.devices.cpu.shm", "CpuShmTensorWrapper", vt::klass, uint8_t(wrapper_class::cpu_shm)},
    // torch.Size pickles as REDUCE(torch.Size, (tuple,)).
    {"torch", "Size", vt::callable, uint8_t(callable_id::torch_size)},
    // Protocol 2 has no bytes opcode: bytes pickle as _codecs.encode(str, "latin1"),
    // and b"" as bytes() (module renamed to __builtin__ by fix_imports).
    {"_codecs", "encode", vt::callable, uint8_t(callable_id::codecs_encode)},
    {"__builtin__", "bytes", vt::callable, uint8_t(callable_id::builtins_bytes)},
    {"builtins", "bytes", vt::callable, uint8_t(callable_id::builtins_bytes)},
};

// ---------------------------------------------------------------------------
// Opcodes (CPython Lib/pickle.py)
// ---------------------------------------------------------------------------

namespace op {
constexpr uint8_t MARK = '(', STOP = '.', BINFLOAT = 'G', BININT = 'J', BININT1 = 'K',
                  BININT2 = 'M', NONE = 'N', BINUNICODE = 'X', SHORT_BINBYTES = 'C',
                  BINBYTES = 'B', EMPTY_TUPLE = ')', TUPLE = 't', EMPTY_LIST = ']', APPEND = 'a',
                  APPENDS = 'e', EMPTY_DICT = '}', SETITEM = 's', SETITEMS = 'u', BINPUT = 'q',
                  LONG_BINPUT = 'r', BINGET = 'h', LONG_BINGET = 'j', GLOBAL = 'c', REDUCE = 'R',
                  BUILD = 'b';
constexpr uint8_t PROTO = 0x80, NEWOBJ = 0x81, TUPLE1 = 0x85, TUPLE2 = 0x86, TUPLE3 = 0x87,
                  NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, SHORT_BINUNICODE = 0x8c,
                  BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, STACK_GLOBAL = 0x93, MEMOIZE = 0x94,
                  FRAME = 0x95;
} // namespace op

/// Printable name of an opcode for error messages (only the ones worth naming).
const char* opcode_name(uint8_t c) {
  switch (c) {
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 'l': return "LIST";
    case 'd': return "DICT";
    case 'p': return "PUT";
    case 'g': return "GET";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x8b: return "LONG4";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return "unknown";
  }
}

std::string hex2(uint8_t c) {
  static const char* d = "0123456789abcdef";
  return std::string("0x") + d[c >> 4] + d[c & 15];
}


// ---------------------------------------------------------------------------
// The machine
// ---------------------------------------------------------------------------

class pickle_vm {
public:
  pickle_vm(std::string_view in, const pickle_limits& lim) : in_(in), lim_(lim) {}

  /// Runs to STOP; returns the index of the result value.
  status run(uint32_t& result);

  const value& at(uint32_t idx) const { return arena_[idx]; }

private:
  std::string_view in_;
  const pickle_limits& lim_;
  size_t pos_ = 0;
  size_t op_at_ = 0; ///< offset of the opcode being executed
  std::vector<value> arena_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_; ///< stack heights at each MARK
  std::vector<int64_t> memo_; ///< slot -> arena index, -1 when unset
  size_t memo_count_ = 0;     ///< set slots (MEMOIZE stores at this index)

  error err(const char* kind, std::string detail) const {
    return error{kind, "pickle offset " + std::to_string(op_at_) + ": " + std::move(detail)};
  }

  // -- input -----------------------------------------------------------------
  bool take(size_t n, std::string_view& out) {
    if (in_.size() - pos_ < n) return false;
    out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool take_le(size_t n, uint64_t& out) {
    std::string_view b;
    if (!take(n, b)) return false;
    out = 0;
    for (size_t k = n; k-- > 0;) out = (out << 8) | static_cast<uint8_t>(b[k]);
    return true;
  }

  // -- values ----------------------------------------------------------------
  status make(value v, uint32_t& idx) {
    if (arena_.size() >= lim_.max_objects)
      return err("pickle_limit", "more than " + std::to_string(lim_.max_objects) + " values");
    idx = static_cast<uint32_t>(arena_.size());
    arena_.push_back(std::move(v));
    return {};
  }
  status push(uint32_t idx) {
    if (stack_.size() + marks_.size() >= lim_.max_stack)
      return err("pickle_limit", "stack deeper than " + std::to_string(lim_.max_stack));
    stack_.push_back(idx);
    return {};
  }
  status push_new(value v) {
    uint32_t idx = 0;
    if (auto e = make(std::move(v), idx); !e) return e.error_value();
    return push(idx);
  }
  /// Pops one value that must sit above the innermost mark.
  status pop(uint32_t& idx) {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) return err("pickle_malformed", "stack underflow");
    idx = stack_.back();
    stack_.pop_back();
    return {};
  }
  status top(uint32_t& idx) const {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) return err("pickle_malformed", "stack underflow");
    idx = stack_.back();
    return {};
  }
  /// Pops everything above the innermost mark, and the mark.
  status pop_mark(std::vector<uint32_t>& out) {
    if (marks_.empty()) return err("pickle_malformed", "no MARK on the stack");
    size_t h = marks_.back();
    marks_.pop_back();
    out.assign(stack_.begin() + static_cast<std::ptrdiff_t>(h), stack_.end());
    stack_.resize(h);
    return {};
  }
  /// Adds `child` into container `parent`, keeping nesting and size bounded.
  status adopt(uint32_t parent, uint32_t child) {
    if (parent == child) return err("pickle_malformed", "a container cannot contain itself");
    value& p = arena_[parent];
    if (p.items.size() >= lim_.max_container)
      return err("pickle_limit", "container with more than " + std::to_string(lim_.max_container) +
                                     " elements");
    uint32_t d = arena_[child].depth + 1;
    if (d > lim_.max_depth)
      return err("pickle_limit", "nesting deeper than " + std::to_string(lim_.max_depth));
    if (d > p.depth) p.depth = d;
    p.items.push_back(child);
    return {};
  }
  status make_tuple(const std::vector<uint32_t>& elems) {
    uint32_t idx = 0;
    value t;
    t.type = vt::tuple;
    if (auto e = make(std::move(t), idx); !e) return e.error_value();
    for (uint32_t c : elems)
      if (auto e = adopt(idx, c); !e) return e.error_value();
    return push(idx);
  }

  // -- opcodes ---------------------------------------------------------------
  status op_int(size_t width, bool is_signed);
  status op_long1();
  status op_string(size_t len_width, vt type);
  status op_memo_put(uint64_t slot);
  status op_memo_get(uint64_t slot);
  status op_global(std::string_view module, std::string_view name);
  status op_reduce();
  status op_newobj();
  status op_build();
  status op_append(bool many);
  status op_setitem(bool many);
  status step(uint8_t c, bool& stop);
};

status pickle_vm::op_int(size_t width, bool is_signed) {
  uint64_t u = 0;
  if (!take_le(width, u)) return err("pickle_truncated", "integer runs past the end");
  value v;
  v.type = vt::integer;
  if (is_signed) // BININT: 4-byte two's complement
    v.i = static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(u)));
  else
    v.i = static_cast<int64_t>(u);
  return push_new(std::move(v));
}

status pickle_vm::op_long1() {
  uint64_t n = 0;
  if (!take_le(1, n)) return err("pickle_truncated", "LONG1 length runs past the end");
  if (n > 8) return err("pickle_limit", "LONG1 of " + std::to_string(n) + " bytes (> 64 bits)");
  std::string_view b;
  if (!take(n, b)) return err("pickle_truncated", "LONG1 runs past the end");
  uint64_t u = 0;
  for (size_t k = n; k-- > 0;) u = (u << 8) | static_cast<uint8_t>(b[k]);
  if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * n); // sign-extend
  value v;
  v.type = vt::integer;
  v.i = static_cast<int64_t>(u);
  return push_new(std::move(v));
}

status pickle_vm::op_string(size_t len_width, vt type) {
  uint64_t n = 0;
  if (!take_le(len_width, n)) return err("pickle_truncated", "length runs past the end");
  std::string_view b;
  // A length beyond the input can never be satisfied: refuse before allocating.
  if (n > in_.size() - pos_ || !take(static_cast<size_t>(n), b))
    return err("pickle_truncated", std::string(vt_name(type)) + " of " + std::to_string(n) +
                                       " bytes runs past the end");
  if (type == vt::str && !valid_utf8(reinterpret_cast<const uint8_t*>(b.data()), b.size(), nullptr, true)) return err("pickle_malformed", "str is not UTF-8");
  value v;
  v.type = type;
  v.s.assign(b.data(), b.size());
  return push_new(std::move(v));
}

status pickle_vm::op_memo_put(uint64_t slot) {
  if (slot >= lim_.max_memo)
    return err("pickle_limit", "memo slot " + std::to_string(slot) + " beyond " + std::to_string(lim_.max_memo));
  uint32_t t = 0;
  if (auto e = top(t); !e) return e.error_value();
  if (memo_.size() <= slot) memo_.resize(static_cast<size_t>(slot) + 1, -1);
  if (memo_[slot] < 0) ++memo_count_;
  memo_[slot] = t;
  return {};
}

status pickle_vm::op_memo_get(uint64_t slot) {
  if (slot >= memo_.size() || memo_[slot] < 0)
    return err("pickle_malformed", "memo slot " + std::to_string(slot) + " was never set");
  // Memo hits share the value (as Python does): no copy, so repeated GETs of a
  // large value cost nothing.
  return push(static_cast<uint32_t>(memo_[slot]));
}

status pickle_vm::op_global(std::string_view module, std::string_view name) {
  for (const auto& g : k_globals) {
    if (module == g.module && name == g.name) {
      value v;
      v.type = g.type;
      v.sub = g.sub;
      v.s.assign(name.data(), name.size());
      return push_new(std::move(v));
    }
  }
  if (module == "torch" && torch_dtype_size(name)) {
    value v;
    v.type = vt::dtype;
    v.s.assign(name.data(), name.size());
    return push_new(std::move(v));
  }
  std::string shown = std::string(module.substr(0, 64)) + "." + std::string(name.substr(0, 64));
  return err("pickle_global", "global '" + shown + "' is not allowed");
}

status pickle_vm::op_reduce() {
  uint32_t args = 0, fn = 0;
  if (auto e = pop(args); !e) return e.error_value();
  if (auto e = pop(fn); !e) return e.error_value();
  const value& f = arena_[fn];
  const value& a = arena_[args];
  if (f.type != vt::callable)
    return err("pickle_malformed", std::string("REDUCE of a ") + vt_name(f.type) + ", not a whitelisted callable");
  if (a.type != vt::tuple) return err("pickle_malformed", "REDUCE arguments are not a tuple");
  switch (static_cast<callable_id>(f.sub)) {
    case callable_id::torch_size: {
      // torch.Size((d0, d1, ...)): a tuple of ints.
      if (a.items.size() != 1 || arena_[a.items[0]].type != vt::tuple)
        return err("pickle_malformed", "torch.Size expects one tuple argument");
      uint32_t inner = a.items[0];
      for (uint32_t c : arena_[inner].items)
        if (arena_[c].type != vt::integer) return err("pickle_malformed", "torch.Size of a non-int");
      return push(inner);
    }
    case callable_id::codecs_encode: {
      // _codecs.encode(s, "latin1"): protocol 2's way of writing bytes.
      if (a.items.size() != 2 || arena_[a.items[0]].type != vt::str || arena_[a.items[1]].type != vt::str)
        return err("pickle_malformed", "_codecs.encode expects (str, str)");
      const std::string& enc = arena_[a.items[1]].s;
      if (enc != "latin1" && enc != "latin-1")
        return err("pickle_malformed", "_codecs.encode with encoding '" + enc.substr(0, 32) + "'");
      const std::string& s = arena_[a.items[0]].s;
      value v;
      v.type = vt::bytes;
      v.s.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        auto c = static_cast<uint8_t>(s[i]);
        if (c < 0x80) {
          v.s.push_back(static_cast<char>(c));
          ++i;
        } else if ((c & 0xe0) == 0xc0 && i + 1 < s.size()) {
          uint32_t cp = ((c & 0x1fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3fu);
          if (cp > 0xff) return err("pickle_malformed", "latin1 encode of a code point above U+00FF");
          v.s.push_back(static_cast<char>(cp));
          i += 2;
        } else {
          return err("pickle_malformed", "latin1 encode of a code point above U+00FF");
        }
      }
      return push_new(std::move(v));
    }
    case callable_id::builtins_bytes: {
      if (!a.items.empty()) return err("pickle_malformed", "bytes() with arguments");
      value v;
      v.type = vt::bytes;
      return push_new(std::move(v));
    }
  }
  return err("pickle_malformed", "REDUCE of an unknown callable");
}

status pickle_vm::op_newobj() {
  uint32_t args = 0, cls = 0;
  if (auto e = pop(args); !e) return e.error_value();
  if (auto e = pop(cls); !e) return e.error_value();
  const value& c = arena_[cls];
  if (c.type != vt::klass)
    return err("pickle_malformed", std::string("NEWOBJ of a ") + vt_name(c.type) + ", not a wrapper class");
  if (arena_[args].type != vt::tuple || !arena_[args].items.empty())
    return err("pickle_malformed", "NEWOBJ with constructor arguments");
  value v;
  v.type = vt::object;
  v.sub = c.sub;
  v.s = c.s;
  return push_new(std::move(v));
}

status pickle_vm::op_build() {
  uint32_t state = 0, obj = 0;
  if (auto e = pop(state); !e) return e.error_value();
  if (auto e = top(obj); !e) return e.error_value();
  if (arena_[obj].type != vt::object) return err("pickle_malformed", "BUILD on a non-object");
  if (arena_[state].type != vt::dict) return err("pickle_malformed", "BUILD state is not a dict");
  // The state's entries become attributes; a later BUILD updates them, as
  // inst.__dict__.update() does. Keys must be attribute names.
  std::vector<uint32_t> entries = arena_[state].items;
  for (size_t k = 0; k < entries.size(); k += 2)
    if (arena_[entries[k]].type != vt::str) return err("pickle_malformed", "BUILD state key is not a str");
  for (uint32_t e : entries)
    if (auto r = adopt(obj, e); !r) return r.error_value();
  return {};
}

status pickle_vm::op_append(bool many) {
  std::vector<uint32_t> elems;
  if (many) {
    if (auto e = pop_mark(elems); !e) return e.error_value();
  } else {
    uint32_t x = 0;
    if (auto e = pop(x); !e) return e.error_value();
    elems.push_back(x);
  }
  uint32_t list = 0;
  if (auto e = top(list); !e) return e.error_value();
  if (arena_[list].type != vt::list) return err("pickle_malformed", "APPEND to a non-list");
  for (uint32_t x : elems)
    if (auto e = adopt(list, x); !e) return e.error_value();
  return {};
}

status pickle_vm::op_setitem(bool many) {
  std::vector<uint32_t> elems;
  if (many) {
    if (auto e = pop_mark(elems); !e) return e.error_value();
    if (elems.size() % 2 != 0) return err("pickle_malformed", "SETITEMS with an odd number of values");
  } else {
    uint32_t k = 0, v = 0;
    if (auto e = pop(v); !e) return e.error_value();
    if (auto e = pop(k); !e) return e.error_value();
    elems = {k, v};
  }
  uint32_t dict = 0;
  if (auto e = top(dict); !e) return e.error_value();
  if (arena_[dict].type != vt::dict) return err("pickle_malformed", "SETITEM on a non-dict");
  for (size_t k = 0; k < elems.size(); k += 2) {
    vt kt = arena_[elems[k]].type;
    // Only hashable scalars can be keys (anything else would raise in Python).
    if (kt != vt::str && kt != vt::integer && kt != vt::bytes && kt != vt::none && kt != vt::boolean)
      return err("pickle_malformed", std::string("dict key of type ") + vt_name(kt));
    if (auto e = adopt(dict, elems[k]); !e) return e.error_value();
    if (auto e = adopt(dict, elems[k + 1]); !e) return e.error_value();
  }
  return {};
}

status pickle_vm::step(uint8_t c, bool& stop) {
  value v;
  switch (c) {
    case op::PROTO:
      return err("pickle_malformed", "PROTO after the start");
    case op::FRAME: {
      uint64_t n = 0;
      if (!take_le(8, n)) return err("pickle_truncated", "FRAME length runs past the end");
      if (n > in_.size() - pos_) return err("pickle_truncated", "FRAME of " + std::to_string(n) + " bytes runs past the end");
      return {}; // framing is only a read-ahead hint
    }
    case op::STOP:
      stop = true;
      return {};
    case op::MARK:
      if (stack_.size() + marks_.size() >= lim_.max_stack)
        return err("pickle_limit", "stack deeper than " + std::to_string(lim_.max_stack));
      marks_.push_back(stack_.size());
      return {};
    case op::NONE:
      return push_new(value{});
    case op::NEWTRUE:
    case op::NEWFALSE:
      v.type = vt::boolean;
      v.b = c == op::NEWTRUE;
      return push_new(std::move(v));
    case op::BININT: return op_int(4, true);
    case op::BININT1: return op_int(1, false);
    case op::BININT2: return op_int(2, false);
    case op::LONG1: return op_long1();
    case op::BINFLOAT: {
      std::string_view b;
      if (!take(8, b)) return err("pickle_truncated", "BINFLOAT runs past the end");
      uint64_t u = 0;
      for (char ch : b) u = (u << 8) | static_cast<uint8_t>(ch); // big-endian
      v.type = vt::floating;
      std::memcpy(&v.f, &u, sizeof v.f);
      return push_new(std::move(v));
    }
    case op::SHORT_BINUNICODE: return op_string(1, vt::str);
    case op::BINUNICODE: return op_string(4, vt::str);
    case op::BINUNICODE8: return op_string(8, vt::str);
    case op::SHORT_BINBYTES: return op_string(1, vt::bytes);
    case op::BINBYTES: return op_string(4, vt::bytes);
    case op::BINBYTES8: return op_string(8, vt::bytes);
    case op::EMPTY_TUPLE: return make_tuple({});
    case op::TUPLE1:
    case op::TUPLE2:
    case op::TUPLE3: {
      size_t n = static_cast<size_t>(c - op::TUPLE1) + 1;
      std::vector<uint32_t> elems(n);
      for (size_t k = n; k-- > 0;)
        if (auto e = pop(elems[k]); !e) return e.error_value();
      return make_tuple(elems);
    }
    case op::TUPLE: {
      std::vector<uint32_t> elems;
      if (auto e = pop_mark(elems); !e) return e.error_value();
      return make_tuple(elems);
    }
    case op::EMPTY_LIST:
      v.type = vt::list;
      return push_new(std::move(v));
    case op::EMPTY_DICT:
      v.type = vt::dict;
      return push_new(std::move(v));
    case op::APPEND: return op_append(false);
    case op::APPENDS: return op_append(true);
    case op::SETITEM: return op_setitem(false);
    case op::SETITEMS: return op_setitem(true);
    case op::BINPUT:
    case op::LONG_BINPUT: {
      uint64_t slot = 0;
      if (!take_le(c == op::BINPUT ? 1 : 4, slot)) return err("pickle_truncated", "memo index runs past the end");
      return op_memo_put(slot);
    }
    case op::MEMOIZE: return op_memo_put(memo_count_);
    case op::BINGET:
    case op::LONG_BINGET: {
      uint64_t slot = 0;
      if (!take_le(c == op::BINGET ? 1 : 4, slot)) return err("pickle_truncated", "memo index runs past the end");
      return op_memo_get(slot);
    }
    case op::GLOBAL: {
      // "module\nname\n"; lines are bounded by the input.
      std::string_view lines[2];
      for (auto& line : lines) {
        size_t nl = in_.find('\n', pos_);
        if (nl == std::string_view::npos) return err("pickle_truncated", "GLOBAL line runs past the end");
        line = in_.substr(pos_, nl - pos_);
        pos_ = nl + 1;
      }
      return op_global(lines[0], lines[1]);
    }
    case op::STACK_GLOBAL: {
      uint32_t name = 0, module = 0;
      if (auto e = pop(name); !e) return e.error_value();
      if (auto e = pop(module); !e) return e.error_value();
      if (arena_[name].type != vt::str || arena_[module].type != vt::str)
        return err("pickle_malformed", "STACK_GLOBAL of non-str");
      return op_global(arena_[module].s, arena_[name].s);
    }
    case op::REDUCE: return op_reduce();
    case op::NEWOBJ: return op_newobj();
    case op::BUILD: return op_build();
    default:
      return err("pickle_opcode", std::string("opcode ") + hex2(c) + " (" + opcode_name(c) + ") is not supported");
  }
}

status pickle_vm::run(uint32_t& result) {
  // Protocol 2+ pickles always open with PROTO; 0 and 1 are never produced by
  // the clients we serve.
  op_at_ = 0;
  if (in_.size() < 2 || static_cast<uint8_t>(in_[0]) != op::PROTO)
    return err("pickle_malformed", "does not start with PROTO (protocol 2-5 expected)");
  auto proto = static_cast<uint8_t>(in_[1]);
  if (proto < 2 || proto > 5) return err("pickle_malformed", "protocol " + std::to_string(proto) + " not supported");
  pos_ = 2;
  bool stop = false;
  while (!stop) {
    op_at_ = pos_;
    if (pos_ >= in_.size()) return err("pickle_truncated", "input ends before STOP");
    auto c = static_cast<uint8_t>(in_[pos_++]);
    if (auto e = step(c, stop); !e) return e.error_value();
  }
  if (pos_ != in_.size()) return err("pickle_malformed", std::to_string(in_.size() - pos_) + " bytes after STOP");
  if (!marks_.empty() || stack_.size() != 1)
    return err("pickle_malformed", "STOP with " + std::to_string(stack_.size()) + " values and " +
                                       std::to_string(marks_.size()) + " marks on the stack");
  result = stack_.back();
  return {};
}

// ---------------------------------------------------------------------------
// Wrapper object -> tensor_desc
// ---------------------------------------------------------------------------

class wrapper_view {
public:
  wrapper_view(const pickle_vm& vm, const value& obj) : vm_(vm), obj_(obj) {}

  /// The attribute's value, or nullptr if absent (the last assignment wins).
  const value* attr(std::string_view name) const {
    const value* found = nullptr;
    for (size_t k = 0; k + 1 < obj_.items.size(); k += 2)
      if (vm_.at(obj_.items[k]).s == name) found = &vm_.at(obj_.items[k + 1]);
    return found;
  }

  status need(std::string_view name, vt type, const value*& out) const {
    out = attr(name);
    if (!out) return bad(std::string("attribute '") + std::string(name) + "' is missing");
    if (out->type != type)
      return bad(std::string("attribute '") + std::string(name) + "': expected " + vt_name(type) + ", got " +
                 vt_name(out->type));
    return {};
  }
  status need_int(std::string_view name, int64_t& out) const {
    const value* v = nullptr;
    if (auto e = need(name, vt::integer, v); !e) return e.error_value();
    out = v->i;
    return {};
  }
  status opt_int(std::string_view name, int64_t& out) const {
    return attr(name) ? need_int(name, out) : status{};
  }
  /// shape / stride: a tuple or list of ints (torch.Size arrives as a tuple).
  status int_seq(const value& v, std::string_view name, std::vector<int64_t>& out) const {
    if (v.type != vt::tuple && v.type != vt::list)
      return bad(std::string("attribute '") + std::string(name) + "': expected a tuple of ints, got " + vt_name(v.type));
    out.clear();
    for (uint32_t c : v.items) {
      const value& e = vm_.at(c);
      if (e.type != vt::integer) return bad(std::string("attribute '") + std::string(name) + "' holds a " + vt_name(e.type));
      out.push_back(e.i);
    }
    return {};
  }

  /// dtype, shape, stride (contiguous if absent: the oldest wrappers had
  /// none), storage_offset (0 if absent).
  status view(tensor_desc& out) const {
    const value* dtype = nullptr;
    if (auto e = need("dtype", vt::dtype, dtype); !e) return e.error_value();
    const value* shape_v = attr("shape");
    if (!shape_v) return bad("attribute 'shape' is missing");
    std::vector<int64_t> shape, stride;
    if (auto e = int_seq(*shape_v, "shape", shape); !e) return e.error_value();
    if (const value* s = attr("stride")) {
      if (auto e = int_seq(*s, "stride", stride); !e) return e.error_value();
    } else {
      stride.assign(shape.size(), 1);
      for (size_t k = shape.size(); k-- > 1;) {
        int64_t dim = shape[k] > 0 ? shape[k] : 1;
        if (__builtin_mul_overflow(stride[k], dim, &stride[k - 1])) return bad("shape overflows int64");
      }
    }
    int64_t storage_offset = 0;
    if (auto e = opt_int("storage_offset", storage_offset); !e) return e.error_value();
    if (auto e = apply_tensor_view(dtype->s, std::move(shape), std::move(stride), storage_offset, out); !e) return prefixed(e.error_value());
    return {};
  }

  error bad(std::string detail) const { return error{"bad_wrapper", obj_.s + ": " + std::move(detail)}; }
  error prefixed(const error& e) const { return error{e.kind, obj_.s + ": " + e.detail}; }

private:
  const pickle_vm& vm_;
  const value& obj_;
};

status map_cuda(const pickle_vm& vm, const wrapper_view& w, tensor_desc& out) {
  const value* h = nullptr;
  if (auto e = w.need("handle", vt::tuple, h); !e) return e.error_value();
  if (h->items.size() != 8)
    return w.bad("attribute 'handle': expected the 8-tuple of storage._share_cuda_(), got " +
                 std::to_string(h->items.size()) + " elements");
  auto item = [&](size_t k) -> const value& { return vm.at(h->items[k]); };
  auto int_at = [&](size_t k, int64_t& o) -> status {
    if (item(k).type != vt::integer) return w.bad("handle[" + std::to_string(k) + "]: expected int, got " + vt_name(item(k).type));
    o = item(k).i;
    return {};
  };
  auto bytes_at = [&](size_t k, std::optional<std::string>& o) -> status {
    if (item(k).type == vt::none) return {};
    if (item(k).type != vt::bytes) return w.bad("handle[" + std::to_string(k) + "]: expected bytes or None, got " + vt_name(item(k).type));
    o = item(k).s;
    return {};
  };
  torch_cuda_share share;
  if (auto e = int_at(0, share.device); !e) return e.error_value();
  if (auto e = bytes_at(1, share.mem_handle); !e) return e.error_value();
  if (auto e = int_at(2, share.storage_size_bytes); !e) return e.error_value();
  if (auto e = int_at(3, share.storage_offset_bytes); !e) return e.error_value();
  if (auto e = bytes_at(4, share.ref_counter_handle); !e) return e.error_value();
  if (auto e = int_at(5, share.ref_counter_offset); !e) return e.error_value();
  if (auto e = bytes_at(6, share.event_handle); !e) return e.error_value();
  if (item(7).type != vt::boolean) return w.bad(std::string("handle[7]: expected bool, got ") + vt_name(item(7).type));
  share.event_sync_required = item(7).b;
  if (auto e = apply_torch_cuda_share(share, out); !e) return w.prefixed(e.error_value());
  const value* uuid = nullptr;
  if (auto e = w.need("device_uuid", vt::str, uuid); !e) return e.error_value();
  out.device_uuid = uuid->s;
  return w.view(out);
}

status map_cuda_raw(const wrapper_view& w, tensor_desc& out) {
  const value* handle = nullptr;
  if (auto e = w.need("_ipc_handle_reserved", vt::bytes, handle); !e) return e.error_value();
  if (handle->s.size() != 64)
    return w.bad("attribute '_ipc_handle_reserved': expected 64 bytes, got " + std::to_string(handle->s.size()));
  int64_t alloc_offset = 0, nbytes = 0;
  if (auto e = w.opt_int("_alloc_offset", alloc_offset); !e) return e.error_value(); // absent before 0.4: the handle's own pointer
  if (auto e = w.need_int("_nbytes", nbytes); !e) return e.error_value();
  if (alloc_offset < 0 || nbytes < 0) return w.bad("negative _alloc_offset or _nbytes");
  const value* uuid = nullptr;
  if (auto e = w.need("device_uuid", vt::str, uuid); !e) return e.error_value();
  out.kind = tensor_desc::memory_kind::cuda_ipc;
  out.ipc_mem_handle = handle->s;
  out.storage_offset_bytes = static_cast<uint64_t>(alloc_offset);
  out.storage_size_bytes = static_cast<uint64_t>(nbytes);
  out.device_uuid = uuid->s;
  return w.view(out);
}

status map_cpu_shm(const wrapper_view& w, tensor_desc& out) {
  const value* name = nullptr;
  if (auto e = w.need("shm_name", vt::str, name); !e) return e.error_value();
  int64_t nbytes = 0;
  if (auto e = w.need_int("nbytes", nbytes); !e) return e.error_value();
  if (nbytes < 0) return w.bad("negative nbytes");
  out.kind = tensor_desc::memory_kind::host_shm;
  out.shm_name = name->s;
  out.shm_offset_bytes = 0;
  out.storage_size_bytes = static_cast<uint64_t>(nbytes);
  if (const value* uuid = w.attr("device_uuid"); uuid && uuid->type == vt::str) out.device_uuid = uuid->s;
  return w.view(out);
}

} // namespace

expected<tensor_desc> decode_pickled_ipc_wrapper(std::string_view pickle,
                                                 const pickle_limits& limits) {
  pickle_vm vm(pickle, limits);
  uint32_t root = 0;
  if (auto e = vm.run(root); !e) return e.error_value();
  const value& obj = vm.at(root);
  if (obj.type != vt::object)
    return error{"bad_wrapper", std::string("pickle holds a ") + vt_name(obj.type) + ", not a wrapper object"};
  wrapper_view w(vm, obj);
  tensor_desc out;
  status e;
  switch (static_cast<wrapper_class>(obj.sub)) {
    case wrapper_class::cuda: e = map_cuda(vm, w, out); break;
    case wrapper_class::cuda_raw: e = map_cuda_raw(w, out); break;
    case wrapper_class::cpu_shm: e = map_cpu_shm(w, out); break;
    case wrapper_class::cuda_vmm:
      e = error{"unsupported_wrapper", "VmmCudaIPCWrapper: CUDA VMM handles need an fd passed out of band"};
      break;
  }
  if (!e) return e.error_value();
  return out;
}

} // namespace kvs
