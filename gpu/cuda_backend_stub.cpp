// Builds without nvcc still link the CUDA entry points; they say why there
// is no CUDA backend instead of failing to link.
#include "gpu/transfer_backend.hpp"

#if !defined(KVSIDECAR_HAVE_CUDA)

namespace kvs {

bool cuda_device_present(std::string* detail) {
  if (detail) *detail = "kvsidecar was built without CUDA (no nvcc at configure time)";
  return false;
}

std::unique_ptr<transfer_backend> make_cuda_backend(std::string* why_not) {
  cuda_device_present(why_not);
  return nullptr;
}

} // namespace kvs

#endif
