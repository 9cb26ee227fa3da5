// libFuzzer target: the strict pickle reader. Any input must end in a
// tensor_desc that is self-consistent or in a named error, within the caps.
#include "tests/fuzz/fuzz_fail.hpp"
#include "lmcache_wire/pickle_reader.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = kvs::decode_pickled_ipc_wrapper(std::string_view(reinterpret_cast<const char*>(data), size));
  if (auto* d = r ? &r.value() : nullptr) {
    if (d->shape.size() != d->stride.size() || d->element_size == 0 || d->dtype.empty()) KVS_FUZZ_FAIL();
  } else if (r.error_value().kind.empty()) {
    KVS_FUZZ_FAIL();
  }
  return 0;
}
