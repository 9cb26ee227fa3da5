// Builds without nvcc still link the CUDA entry points; they say why there
// is no CUDA backend instead of failing to link.
#include "gpu/transfer_backend.hpp"

#if !defined(KVSIDECAR_HAVE_CUDA)

namespace kvs {

expected<std::string> cuda_device_present() {
  return make_error("no_cuda", "kvsidecar was built without CUDA (no nvcc at configure time)");
}

expected<std::unique_ptr<transfer_backend>> make_cuda_backend() {
  return cuda_device_present().error_value();
}

} // namespace kvs

#endif
