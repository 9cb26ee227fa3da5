// bench_grpc_rtt: kvsidecar's own cost per request on each LMCache
// transport, without LMCache's Python client in the way (its gRPC client
// spends ~1 ms of CPU per call on this machine, more than the server).
//
// One C++ client thread, one request at a time, against a running kvsidecar
// with both endpoints: NOOP over gRPC (/lmcache.mp.ManagementService/Noop,
// grpc::GenericStub, one completion queue) and NOOP over ZeroMQ (a DEALER
// sending LMCache's frames: uid, op 24). Blocks alternate gRPC / ZeroMQ;
// medians of the per-block p50 / p99.
//
//   bench_grpc_rtt --grpc 127.0.0.1:PORT --zmq tcp://127.0.0.1:PORT [--iters 2000] [--reps 5]
//
// Prints one `RESULT grpc_p50_us=.. grpc_p99_us=.. zmq_p50_us=.. zmq_p99_us=.. ratio_p50=..`.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}
double median(std::vector<double> v) {
  return pct(std::move(v), 0.5);
}

struct grpc_client {
  std::shared_ptr<grpc::Channel> ch;
  grpc::GenericStub stub;
  grpc::CompletionQueue cq;
  explicit grpc_client(const std::string& target)
    : ch(grpc::CreateChannel(target, grpc::InsecureChannelCredentials())), stub(ch) {}
  bool noop() {
    grpc::ClientContext ctx;
    static const std::string id(16, 'k');
    ctx.AddMetadata("lmcache-client-id-bin", id);
    static const grpc::Slice empty{"", 0};
    grpc::ByteBuffer req{&empty, 1}; // NoopRequest{}: zero bytes
    grpc::ByteBuffer resp;
    grpc::Status st;
    auto call = stub.PrepareUnaryCall(&ctx, "/lmcache.mp.ManagementService/Noop", req, &cq);
    call->StartCall();
    call->Finish(&resp, &st, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok && st.ok();
  }
};

struct zmq_client {
  zmq::context_t ctx;
  zmq::socket_t s{ctx, zmq::socket_type::dealer};
  uint8_t uid = 0;
  explicit zmq_client(const std::string& ep) {
    s.set(zmq::sockopt::linger, 0);
    s.connect(ep);
  }
  bool noop() {
    // uid (msgpack fixint), op 24 (noop, LMCache's legacy id), no args.
    uid = static_cast<uint8_t>((uid + 1) & 0x7f);
    const uint8_t op = 24;
    s.send(zmq::buffer(&uid, 1), zmq::send_flags::sndmore);
    s.send(zmq::buffer(&op, 1), zmq::send_flags::none);
    std::vector<zmq::message_t> parts;
    for (;;) {
      zmq::message_t m;
      if (!s.recv(m))
        return false;
      const bool more = m.more();
      parts.push_back(std::move(m));
      if (!more)
        break;
    }
    return parts.size() >= 2;
  }
};

template <class Client>
std::vector<double> block(Client& c, int iters, bool* ok) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    auto t0 = clock_type::now();
    if (!c.noop()) {
      *ok = false;
      return us;
    }
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  return us;
}

} // namespace

int main(int argc, char** argv) {
  std::string grpc_target, zmq_ep;
  int iters = 2000, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--grpc")
      grpc_target = argv[i + 1];
    else if (k == "--zmq")
      zmq_ep = argv[i + 1];
    else if (k == "--iters")
      iters = std::max(10, std::atoi(argv[i + 1]));
    else if (k == "--reps")
      reps = std::max(1, std::atoi(argv[i + 1]));
  }
  if (grpc_target.empty() || zmq_ep.empty()) {
    std::fprintf(stderr, "usage: bench_grpc_rtt --grpc HOST:PORT --zmq tcp://HOST:PORT "
                         "[--iters N] [--reps N]\n");
    return 2;
  }
  grpc_client g{grpc_target};
  zmq_client z{zmq_ep};
  bool ok = true;
  block(g, 200, &ok); // warm-up: connections, first-call paths
  if (!ok) {
    std::fprintf(stderr, "gRPC warm-up failed: is kvsidecar serving %s?\n", grpc_target.c_str());
    return 1;
  }
  block(z, 200, &ok);
  if (!ok) {
    std::fprintf(stderr, "ZeroMQ warm-up failed: is kvsidecar serving %s?\n", zmq_ep.c_str());
    return 1;
  }
  std::vector<double> g50, g99, z50, z99;
  for (int r = 0; r < reps; ++r) {
    for (int side = 0; side < 2; ++side) {
      const bool grpc_first = (r % 2 == 0) == (side == 0);
      auto us = grpc_first ? block(g, iters, &ok) : block(z, iters, &ok);
      if (!ok) {
        std::fprintf(stderr, "a request failed\n");
        return 1;
      }
      (grpc_first ? g50 : z50).push_back(pct(us, 0.5));
      (grpc_first ? g99 : z99).push_back(pct(us, 0.99));
    }
  }
  const double gm = median(g50), zm = median(z50);
  std::printf("RESULT grpc_p50_us=%.1f grpc_p99_us=%.1f zmq_p50_us=%.1f zmq_p99_us=%.1f "
              "ratio_p50=%.2f reps=%d iters=%d\n",
              gm, median(g99), zm, median(z99), gm / zm, reps, iters);
  return 0;
}
