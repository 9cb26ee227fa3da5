// LMCache 0.5.7's inline transfer envelopes (lmcache_wire/tensor_envelope.hpp):
// the grouped form hybrid-KV workers send and read, byte for byte as
// msgspec writes it, and every malformed group refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lmcache_wire/tensor_envelope.hpp"
#include "msgpack/msgpack_writer.hpp"
#include "frame_bytes.hpp"

using namespace kvs;

namespace {

/// Hex without the spaces frame_bytes.hpp puts between bytes.
std::string hex(const std::string& s) {
  std::string h = kvs_test::hex(s);
  h.erase(std::remove(h.begin(), h.end(), ' '), h.end());
  return h;
}

/// A GroupedTensorEnvelope with one group of `indices`, each tensor one float16 [1].
std::string one_group(const std::vector<int64_t>& indices, size_t tensors) {
  std::string out;
  msgpack_io::writer w(out);
  w.map(2);
  w.key("version");
  w.uint(1);
  w.key("groups");
  w.array(1);
  w.map(2);
  w.key("chunk_indices");
  w.array(static_cast<uint32_t>(indices.size()));
  for (auto i : indices)
    w.sint(i);
  w.key("tensors");
  w.array(static_cast<uint32_t>(tensors));
  for (size_t k = 0; k < tensors; ++k) {
    w.map(3);
    w.key("dtype");
    w.str("float16");
    w.key("shape");
    w.array(1);
    w.uint(1);
    w.key("data");
    w.bin(std::string_view("\x01\x02", 2));
  }
  w.finish();
  return out;
}

} // namespace

TEST_CASE("grouped envelope: msgspec's bytes, and back") {
  std::vector<envelope_group_out> groups{{"bfloat16", {2}, 3, {"abcd", "efgh"}},
                                         {"float32", {1}, 0, {}}};
  std::string out;
  encode_grouped_tensor_envelope(out, groups);
  // {"version": 1, "groups": [{"chunk_indices": [3, 4], "tensors": [{"dtype":
  // "bfloat16", "shape": [2], "data": b"abcd"}, ...]}, {"chunk_indices": [],
  // "tensors": []}]} -- msgspec.msgpack.encode of tensor_wire.py's Structs.
  CHECK(hex(out) ==
        "82a776657273696f6e01a667726f7570739282ad6368756e6b5f696e646963657392"
        "0304a774656e736f72739283a56474797065a862666c6f61743136a5736861706591"
        "02a464617461c4046162636483a56474797065a862666c6f61743136a57368617065"
        "9102a464617461c4046566676882ad6368756e6b5f696e646963657390a774656e73"
        "6f727390");
  auto back = decode_grouped_tensor_envelope(out);
  REQUIRE(back);
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].chunk_indices == std::vector<int64_t>{3, 4});
  CHECK((*back)[0].tensors[1].data == "efgh");
  CHECK((*back)[0].tensors[0].dtype == "bfloat16");
  CHECK((*back)[1].tensors.empty());
}

TEST_CASE("grouped envelope: malformed groups are refused naming where") {
  auto refused = [](const std::string& bytes, const std::string& part) {
    auto got = decode_grouped_tensor_envelope(bytes);
    REQUIRE_FALSE(got);
    CAPTURE(got.error_value().detail);
    CHECK(got.error_value().detail.find(part) != std::string::npos);
  };
  refused(one_group({0, 1}, 1), "groups[0]: 2 chunk_indices for 1 tensors");
  refused(one_group({1, 1}, 2), "not non-negative and strictly increasing at index 1");
  refused(one_group({-1}, 1), "chunk_indices");
  CHECK(decode_grouped_tensor_envelope(one_group({0, 2}, 2)));
  // A single-group envelope is not a grouped one (disjoint field names).
  std::string flat;
  encode_tensor_envelope(flat, "float16", {1}, {"ab"});
  refused(flat, "unknown field 'tensors'");
}
