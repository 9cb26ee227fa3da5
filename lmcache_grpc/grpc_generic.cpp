// The generic gRPC conversions (grpc_generic.hpp): the op's row names its
// arguments and their kinds; the RPC's descriptors name the message fields.
// Both are matched once per op, at first use, so a call does one field
// lookup per argument by pointer, not by name.
#include "lmcache_grpc/grpc_generic.hpp"

#include "lmcache_grpc/grpc_key_frame.hpp"
#include "lmcache_grpc/grpc_request_step.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "msgpack/msgpack_reader.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <climits>
#include <memory>

namespace kvs {

namespace {

namespace gp = google::protobuf;
using msgpack_io::writer;

const gp::MethodDescriptor* find_rpc(const char* path) {
  if (!path || path[0] != '/')
    return nullptr;
  std::string full(path + 1); // "/pkg.Service/Method" -> "pkg.Service.Method"
  auto slash = full.find('/');
  if (slash == std::string::npos)
    return nullptr;
  full[slash] = '.';
  return gp::DescriptorPool::generated_pool()->FindMethodByName(full);
}

/// Does proto field `f` carry an argument of kind `k`?
bool fits(const gp::FieldDescriptor* f, mp_arg_kind k) {
  if (!f || f->is_repeated())
    return false;
  using T = gp::FieldDescriptor;
  switch (k) {
    case mp_arg_kind::key:
      return f->cpp_type() == T::CPPTYPE_MESSAGE &&
             f->message_type() == lmcache::mp::IpcCacheServerKey::descriptor();
    case mp_arg_kind::int64:
      return f->cpp_type() == T::CPPTYPE_INT64 || f->cpp_type() == T::CPPTYPE_INT32;
    case mp_arg_kind::opt_int64:
      return f->cpp_type() == T::CPPTYPE_INT64 && f->has_presence();
    case mp_arg_kind::str:
    case mp_arg_kind::bin:
      return f->cpp_type() == T::CPPTYPE_STRING;
    case mp_arg_kind::boolean:
      return f->cpp_type() == T::CPPTYPE_BOOL;
    case mp_arg_kind::float64:
      return f->cpp_type() == T::CPPTYPE_DOUBLE;
    case mp_arg_kind::other:
      return false;
  }
  return false;
}

/// One op's RPC and, where its request is generic, the field of each argument.
struct generic_op {
  const gp::MethodDescriptor* rpc = nullptr;
  bool request = false; ///< every argument has a generic kind and a field that fits it
  const gp::FieldDescriptor* fields[7] = {};
};

const generic_op& generic_of(const mp_op_row& row) {
  static const std::vector<generic_op> table = [] {
    std::vector<generic_op> t(256);
    for (const auto& r : all_op_rows()) {
      auto& g = t[static_cast<uint8_t>(r.op)];
      g.rpc = find_rpc(r.grpc_path ? r.grpc_path : r.grpc_path_057);
      // A stream, or an argument only 0.5.7 sends (written by the latch), is a row's.
      if (!g.rpc || r.streamed || r.last_arg_057)
        continue;
      bool all = true;
      for (size_t k = 0; k < r.max_args; ++k) {
        g.fields[k] = g.rpc->input_type()->FindFieldByName(r.arg_names[k]);
        // The key, when there is one, is the first argument (the step's order).
        all = all && fits(g.fields[k], r.arg_kinds[k]) && (k == 0 || r.arg_kinds[k] != mp_arg_kind::key);
      }
      g.request = all;
    }
    return t;
  }();
  return table[static_cast<uint8_t>(row.op)];
}

} // namespace

std::optional<expected<std::vector<std::string>>>
grpc_generic_request(const mp_op_row& row, std::string_view bytes, client_release dialect) {
  const auto& g = generic_of(row);
  if (!g.request)
    return std::nullopt;
  // The step of grpc_request_step.hpp, over the message's reflection:
  // parse -> check (the key's release) -> key -> the other arguments.
  const gp::Descriptor* type = g.rpc->input_type();
  const std::string& name = type->name();
  std::unique_ptr<gp::Message> msg(gp::MessageFactory::generated_factory()->GetPrototype(type)->New());
  if (bytes.size() > static_cast<size_t>(INT_MAX) ||
      !msg->ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return grpc_bad_request(name, "not a valid protobuf message (" + std::to_string(bytes.size()) +
                                    " bytes)");
  const gp::Reflection* refl = msg->GetReflection();
  client_release rel = dialect;
  std::optional<std::string> key;
  size_t k = 0;
  if (row.max_args > 0 && row.arg_kinds[0] == mp_arg_kind::key) {
    const auto& pk = static_cast<const lmcache::mp::IpcCacheServerKey&>(refl->GetMessage(*msg, g.fields[0]));
    rel = grpc_key_release(rel, pk);
    auto frame = grpc_key_frame(pk, rel, name + ".key");
    if (!frame)
      return frame.error_value();
    key = std::move(*frame);
    k = 1;
  }
  grpc_request::arg_frames a{name, rel};
  if (key)
    a.add_encoded(std::move(*key));
  for (; k < row.max_args; ++k) {
    const gp::FieldDescriptor* f = g.fields[k];
    switch (row.arg_kinds[k]) {
      case mp_arg_kind::int64:
        a.sint(f->cpp_type() == gp::FieldDescriptor::CPPTYPE_INT32 ? refl->GetInt32(*msg, f)
                                                                   : refl->GetInt64(*msg, f));
        break;
      case mp_arg_kind::opt_int64:
        a.add([&](writer& w) {
          if (refl->HasField(*msg, f))
            w.sint(refl->GetInt64(*msg, f));
          else
            w.nil();
        });
        break;
      case mp_arg_kind::str:
        a.str(refl->GetString(*msg, f));
        break;
      case mp_arg_kind::bin:
        a.bin(refl->GetString(*msg, f));
        break;
      case mp_arg_kind::boolean:
        a.add([&](writer& w) { w.boolean(refl->GetBool(*msg, f)); });
        break;
      case mp_arg_kind::float64:
        a.add([&](writer& w) { w.float64(refl->GetDouble(*msg, f)); });
        break;
      case mp_arg_kind::key:
      case mp_arg_kind::other:
        a.fail(f->name().c_str(), "not a generic argument"); // not reached: generic_of checked
        break;
    }
  }
  return std::move(a).take();
}

std::optional<expected<std::string>> grpc_generic_response(const mp_op_row& row,
                                                           grpc_reply::body_reader& b,
                                                           bool has_body) {
  const auto& g = generic_of(row);
  if (!g.rpc)
    return std::nullopt;
  const gp::Descriptor* type = g.rpc->output_type();
  if (type->field_count() == 0)
    return std::string{};
  const gp::FieldDescriptor* f = type->field(0);
  using T = gp::FieldDescriptor;
  if (type->field_count() != 1 || f->is_repeated() || f->cpp_type() == T::CPPTYPE_MESSAGE ||
      f->cpp_type() == T::CPPTYPE_ENUM)
    return std::nullopt;
  std::unique_ptr<gp::Message> msg(gp::MessageFactory::generated_factory()->GetPrototype(type)->New());
  const gp::Reflection* refl = msg->GetReflection();
  if (!has_body) {
    if (!f->has_presence())
      return expected<std::string>{b.fail("no reply body")};
    return msg->SerializeAsString();
  }
  auto it = b.next();
  if (!it)
    return expected<std::string>{it.error_value()};
  using msgpack_io::value_type;
  const auto kind = it->kind;
  const char* want = nullptr;
  if (kind == value_type::nil && f->has_presence()) {
    // int | None: the optional field left unset.
  } else if (f->cpp_type() == T::CPPTYPE_INT64 || f->cpp_type() == T::CPPTYPE_INT32) {
    if (kind == value_type::uint || kind == value_type::sint) {
      const int64_t v = grpc_reply::body_reader::as_int(*it);
      if (f->cpp_type() == T::CPPTYPE_INT64)
        refl->SetInt64(msg.get(), f, v);
      else
        refl->SetInt32(msg.get(), f, static_cast<int32_t>(v));
    } else {
      want = "int";
    }
  } else if (f->cpp_type() == T::CPPTYPE_BOOL) {
    if (kind == value_type::boolean)
      refl->SetBool(msg.get(), f, it->u != 0);
    else
      want = "bool";
  } else if (f->cpp_type() == T::CPPTYPE_STRING) {
    if (kind == value_type::str || kind == value_type::bin)
      refl->SetString(msg.get(), f, std::string{grpc_reply::body_reader::as_view(*it)});
    else
      want = "str or bytes";
  } else {
    return std::nullopt;
  }
  if (want)
    return expected<std::string>{b.fail(f->name() + ": expected " + want + ", got " +
                                        msgpack_io::kind_name(kind))};
  return msg->SerializeAsString();
}

} // namespace kvs
