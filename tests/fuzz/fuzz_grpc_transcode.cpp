// libFuzzer target: LMCache's gRPC messages -> ZeroMQ frames -> the shared
// request decoder, and reply bodies -> gRPC response messages. Input:
//   byte 0: which method (index into the paths below), bit 7: reply side;
//   byte 1: the client's release (0 unknown, 1 0.5.6, 2 0.5.7);
//   the rest: the request message (or, reply side, the msgpack body).
// The frames a request becomes must decode or be refused with an error;
// nothing may crash, leak or read out of bounds.
#include "tests/fuzz/fuzz_fail.hpp"
#include "lmcache_grpc/grpc_methods.hpp"
#include "lmcache_grpc/grpc_transcode.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr std::array<std::string_view, 24> paths{
  "/lmcache.mp.LMCacheDrivenService/RegisterKvCache",
  "/lmcache.mp.LMCacheDrivenService/UnregisterKvCache",
  "/lmcache.mp.LMCacheDrivenService/Store",
  "/lmcache.mp.LMCacheDrivenService/Retrieve",
  "/lmcache.mp.LookupService/Lookup",
  "/lmcache.mp.LookupService/QueryPrefetchStatus",
  "/lmcache.mp.LookupService/WaitPrefetchStatus",
  "/lmcache.mp.LookupService/FreeLookupLocks",
  "/lmcache.mp.LookupService/EndSession",
  "/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext",
  "/lmcache.mp.EngineDrivenService/UnregisterKvCacheEngineDrivenContext",
  "/lmcache.mp.EngineDrivenService/PrepareStore",
  "/lmcache.mp.EngineDrivenService/CommitStore",
  "/lmcache.mp.EngineDrivenService/PrepareRetrieve",
  "/lmcache.mp.EngineDrivenService/CommitRetrieve",
  "/lmcache.mp.ControllerService/Clear",
  "/lmcache.mp.ControllerService/Ping",
  "/lmcache.mp.ControllerService/ServerModuleCall",
  "/lmcache.mp.ObservabilityService/ReportBlockAllocation",
  "/lmcache.mp.ObservabilityService/SubscribeKvEvents",
  "/lmcache.mp.ManagementService/NegotiateChunkSize",
  "/lmcache.mp.ManagementService/GetExperimental",
  "/lmcache.mp.ManagementService/Noop",
  "/lmcache.mp.ExtensionService/ServerModuleAffinityCall",
};

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kvs::silence_protobuf_log(); // as the server does: bad messages are answered, not logged by libprotobuf
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2)
    return 0;
  const auto* m = kvs::find_grpc_method(paths[(data[0] & 0x7f) % paths.size()]);
  if (!m)
    KVS_FUZZ_FAIL();
  const auto dialect = static_cast<kvs::client_release>(
    data[1] % 3 == 0 ? 0 : data[1] % 3 == 1 ? 2 : 3); // unknown, v0_5_6, v0_5_7
  std::string_view in(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (data[0] & 0x80) {
    auto r = m->subscribe ? kvs::grpc_kv_event_batch(in)
                          : kvs::grpc_response(*m, std::string{in});
    if (!r && r.error_value().kind != "bad_reply")
      KVS_FUZZ_FAIL();
    return 0;
  }
  auto frames = kvs::grpc_request_frames(*m, in, dialect, 1);
  if (!frames) {
    if (frames.error_value().kind != "bad_request" || frames.error_value().detail.empty())
      KVS_FUZZ_FAIL();
    return 0;
  }
  if (frames->size() < 2 || kvs::grpc_call_id((*frames)[0]) != 1u)
    KVS_FUZZ_FAIL();
  if (m->subscribe)
    return 0;
  std::vector<std::string_view> views(frames->begin(), frames->end());
  auto req = kvs::decode_mp_request(views);
  if (req && req->op != m->op)
    KVS_FUZZ_FAIL();
  return 0;
}
