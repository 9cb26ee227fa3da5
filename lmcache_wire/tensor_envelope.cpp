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

/// The "tensors" array at `where`.
status read_tensors(cursor& c, const std::string& where, std::vector<envelope_tensor>& out) {
  uint32_t n = 0;
  if (auto r = read_header(c, where, mk::array, n); !r)
    return r;
  if (n > envelope_max_tensors)
    return fail(where, std::to_string(n) + " tensors, above " + std::to_string(envelope_max_tensors));
  out.reserve(std::min<uint32_t>(n, k_reserve_cap));
  for (uint32_t k = 0; k < n; ++k) {
    envelope_tensor t;
    if (auto r = read_tensor(c, at_index(where, k), t); !r)
      return r;
    out.push_back(std::move(t));
  }
  return {};
}

status read_group(cursor& c, const std::string& where, envelope_group& g) {
  required req{{{"chunk_indices", false}, {"tensors", false}}};
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    req.seen(f);
    if (f == "chunk_indices") {
      if (auto r = read_int_array(c, at_field(where, f), g.chunk_indices, true); !r)
        return r;
      if (g.chunk_indices.size() > envelope_max_tensors)
        return fail(at_field(where, f), "more than " + std::to_string(envelope_max_tensors)
                                          + " indices");
      return {};
    }
    if (f == "tensors")
      return read_tensors(c, at_field(where, f), g.tensors);
    known = false;
    return {};
  });
  if (!e)
    return e;
  if (auto r = req.check(where, "TensorGroup"); !r)
    return r;
  if (g.chunk_indices.size() != g.tensors.size())
    return fail(where, std::to_string(g.chunk_indices.size()) + " chunk_indices for "
                         + std::to_string(g.tensors.size()) + " tensors");
  for (size_t k = 0; k < g.chunk_indices.size(); ++k)
    if (g.chunk_indices[k] < 0 || (k > 0 && g.chunk_indices[k] <= g.chunk_indices[k - 1]))
      return fail(at_field(where, "chunk_indices"), "not non-negative and strictly increasing "
                                                    "at index " + std::to_string(k));
  return {};
}

void write_tensors(msgpack_io::writer& w, const std::string& dtype,
                   const std::vector<int64_t>& shape, const std::vector<std::string_view>& datas) {
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
}

/// A versioned envelope {"version": 1, <list_field>: ...} (msgspec Struct,
/// forbid_unknown_fields) filling the whole of `bytes`; `read_list` reads
/// the list field's value.
template <class ReadList>
status read_envelope(std::string_view bytes, const std::string& where, std::string_view list_field,
                     ReadList&& read_list) {
  cursor c(bytes);
  int64_t version = -1;
  bool have_list = false;
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> status {
    known = true;
    if (f == "version")
      return read_int(c, at_field(where, f), version);
    if (f == list_field) {
      have_list = true;
      return read_list(c);
    }
    known = false;
    return {};
  });
  if (!e)
    return e;
  if (!c.at_end())
    return fail(where, std::to_string(c.left()) + " bytes after the envelope");
  if (version != 1)
    return fail(where, "version " + std::to_string(version) + " (only 1 is known)");
  if (!have_list)
    return fail(where, where + " missing required field '" + std::string(list_field) + "'");
  return {};
}

} // namespace

expected<std::vector<envelope_tensor>> decode_tensor_envelope(std::string_view bytes) {
  std::vector<envelope_tensor> out;
  auto e = read_envelope(bytes, "TensorEnvelope", "tensors",
                         [&](cursor& c) { return read_tensors(c, "tensors", out); });
  if (!e)
    return e.error_value();
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
  write_tensors(w, dtype, shape, datas);
  w.finish();
}

expected<std::vector<envelope_group>> decode_grouped_tensor_envelope(std::string_view bytes) {
  std::vector<envelope_group> out;
  auto e = read_envelope(bytes, "GroupedTensorEnvelope", "groups", [&](cursor& c) -> status {
    uint32_t n = 0;
    if (auto r = read_header(c, "groups", mk::array, n); !r)
      return r;
    if (n > envelope_max_groups)
      return fail("groups", std::to_string(n) + " groups, above " + std::to_string(envelope_max_groups));
    size_t total = 0;
    for (uint32_t k = 0; k < n; ++k) {
      envelope_group g;
      if (auto r = read_group(c, at_index("groups", k), g); !r)
        return r;
      total += g.tensors.size();
      if (total > envelope_max_tensors)
        return fail("groups", "more than " + std::to_string(envelope_max_tensors) + " tensors in all");
      out.push_back(std::move(g));
    }
    return {};
  });
  if (!e)
    return e.error_value();
  return out;
}

void encode_grouped_tensor_envelope(std::string& out,
                                    const std::vector<envelope_group_out>& groups) {
  size_t total = 32;
  for (const auto& g : groups)
    for (auto d : g.datas)
      total += d.size() + 56;
  msgpack_io::writer w(out);
  w.reserve(total);
  w.map(2);
  w.key("version");
  w.uint(1);
  w.key("groups");
  w.array(static_cast<uint32_t>(groups.size()));
  for (const auto& g : groups) {
    w.map(2);
    w.key("chunk_indices");
    w.array(static_cast<uint32_t>(g.datas.size()));
    for (size_t k = 0; k < g.datas.size(); ++k)
      w.uint(g.first + k);
    w.key("tensors");
    write_tensors(w, g.dtype, g.shape, g.datas);
  }
  w.finish();
}

} // namespace kvs
