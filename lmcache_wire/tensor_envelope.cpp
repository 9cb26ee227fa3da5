#include "lmcache_wire/tensor_envelope.hpp"

#include "lmcache_wire/lmcache_reads.hpp"
#include "msgpack/msgpack_writer.hpp"

namespace kvs {

using namespace lmcache_wire;

namespace {

status read_tensor(cursor& c, const std::string& where, envelope_tensor& t) {
  required req{{{"dtype", false}, {"shape", false}, {"data", false}}};
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    if (f == "dtype")
      return read_str(c, at_field(where, f), t.dtype);
    if (f == "shape") {
      if (auto r = read_int_array(c, at_field(where, f), t.shape, true); !r)
        return r;
      if (t.shape.size() > envelope_max_rank)
        return fail(at_field(where, f), "rank " + std::to_string(t.shape.size()) + " above "
                                          + std::to_string(envelope_max_rank));
      return {};
    }
    if (f == "data") {
      item it;
      if (auto r = read_item(c, at_field(where, f), it); !r)
        return r;
      if (it.kind != mk::bin)
        return wrong_kind(at_field(where, f), "bin", it);
      if (it.len > envelope_max_tensor_bytes)
        return fail(at_field(where, f), "above 2 GiB");
      t.data = std::string_view(reinterpret_cast<const char*>(it.ptr), it.len);
      return {};
    }
    known = false;
    return {};
  });
  if (!e)
    return e;
  return req.check(where, "TensorPayload");
}

} // namespace

expected<std::vector<envelope_tensor>> decode_tensor_envelope(std::string_view bytes) {
  cursor c(bytes);
  std::vector<envelope_tensor> out;
  int64_t version = -1;
  bool have_tensors = false;
  const std::string where = "TensorEnvelope";
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    if (f == "version")
      return read_int(c, at_field(where, f), version);
    if (f == "tensors") {
      have_tensors = true;
      uint32_t n = 0;
      if (auto r = read_header(c, at_field(where, f), mk::array, n); !r)
        return r;
      if (n > envelope_max_tensors)
        return fail(at_field(where, f), std::to_string(n) + " tensors, above "
                                          + std::to_string(envelope_max_tensors));
      out.reserve(std::min<uint32_t>(n, k_reserve_cap));
      for (uint32_t k = 0; k < n; ++k) {
        envelope_tensor t;
        if (auto r = read_tensor(c, at_index("tensors", k), t); !r)
          return r;
        out.push_back(std::move(t));
      }
      return {};
    }
    known = false;
    return {};
  });
  if (!e)
    return e.error_value();
  if (!c.at_end())
    return fail(where, std::to_string(c.left()) + " bytes after the envelope");
  if (version != 1)
    return fail(where, "version " + std::to_string(version) + " (only 1 is known)");
  if (!have_tensors)
    return fail(where, "TensorEnvelope missing required field 'tensors'");
  return out;
}

void encode_tensor_envelope(std::string& out, const std::string& dtype,
                            const std::vector<int64_t>& shape,
                            const std::vector<std::string_view>& datas) {
  size_t total = 32;
  for (auto d : datas)
    total += d.size() + 48;
  msgpack_io::writer w(out);
  w.reserve(total);
  w.map(2);
  w.key("version");
  w.uint(1);
  w.key("tensors");
  w.array(static_cast<uint32_t>(datas.size()));
  for (auto d : datas) {
    w.map(3);
    w.key("dtype");
    w.str(dtype);
    w.key("shape");
    w.array(static_cast<uint32_t>(shape.size()));
    for (auto s : shape)
      w.uint(static_cast<uint64_t>(s));
    w.key("data");
    w.bin(d);
  }
  w.finish();
}

} // namespace kvs
