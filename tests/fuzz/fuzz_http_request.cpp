// libFuzzer target: the HTTP request-head reader. Any input ends in one of
// its three states, self-consistent: a complete head names a method and a
// path starting with '/', both inside the input; a bad one a 400/431 and why.
#include "tests/fuzz/fuzz_fail.hpp"
#include "http/http_request.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  for (size_t limit : {size_t{64}, size_t{8192}}) {
    auto h = kvs::parse_http_head(in, limit);
    auto inside = [&](std::string_view v) {
      return v.data() >= in.data() && v.data() + v.size() <= in.data() + in.size();
    };
    switch (h.st) {
    case kvs::http_head::state::complete:
      if (h.method.empty() || h.path.empty() || h.path.front() != '/' || !inside(h.method)
          || !inside(h.path))
        KVS_FUZZ_FAIL();
      if ((!h.query.empty() && !inside(h.query))
          || (!h.authorization.empty() && !inside(h.authorization)) || h.head_size == 0
          || h.head_size > size || h.head_size > limit)
        KVS_FUZZ_FAIL();
      break;
    case kvs::http_head::state::bad:
      if ((h.status != 400 && h.status != 431) || !h.why || !*h.why)
        KVS_FUZZ_FAIL();
      break;
    case kvs::http_head::state::incomplete:
      if (size >= limit)
        KVS_FUZZ_FAIL(); // at the limit it must be judged
      break;
    }
  }
  return 0;
}
