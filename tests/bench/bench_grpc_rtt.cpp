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
//
// --raw adds the raw limit in the same run, blocks alternating with the
// sidecar's: a plain gRPC server (async generic service, one completion
// queue thread, the empty reply written at once) and a plain ZeroMQ ROUTER
// (the reply sent at once), both in this process, so what the transports
// cost by themselves is measured beside what kvsidecar adds. RESULT then
// also holds raw_grpc_p50_us, raw_zmq_p50_us and raw_ratio_p50.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
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

/// The raw gRPC limit: answers every call with an empty message at once.
struct raw_grpc_server {
  grpc::AsyncGenericService svc;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::unique_ptr<grpc::Server> server;
  std::thread loop;
  int port = 0;

  struct call {
    grpc::GenericServerContext ctx;
    grpc::GenericServerAsyncReaderWriter stream{&ctx};
    grpc::ByteBuffer req;
    int step = 0; // 0 accepted, 1 read, 2 finished
  };

  raw_grpc_server() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterAsyncGenericService(&svc);
    cq = b.AddCompletionQueue();
    server = b.BuildAndStart();
    accept();
    loop = std::thread([this] { run(); });
  }
  ~raw_grpc_server() {
    server->Shutdown();
    cq->Shutdown();
    loop.join();
  }
  void accept() {
    auto* c = new call;
    svc.RequestCall(&c->ctx, &c->stream, cq.get(), cq.get(), c);
  }
  void run() {
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
      auto* c = static_cast<call*>(tag);
      if (!ok || c->step == 2) {
        if (c->step == 0 && ok)
          accept();
        delete c;
        continue;
      }
      if (c->step == 0) {
        accept();
        c->step = 1;
        c->stream.Read(&c->req, c);
      } else {
        static const grpc::Slice empty{"", 0};
        grpc::ByteBuffer resp{&empty, 1};
        c->step = 2;
        c->stream.WriteAndFinish(resp, grpc::WriteOptions(), grpc::Status::OK, c);
      }
    }
  }
};

/// The raw ZeroMQ limit: a ROUTER that sends each request's frames back.
struct raw_zmq_server {
  zmq::context_t ctx;
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::thread loop;
  std::string endpoint;

  raw_zmq_server() {
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    endpoint = router.get(zmq::sockopt::last_endpoint);
    loop = std::thread([this] { run(); });
  }
  ~raw_zmq_server() {
    ctx.shutdown(); // the blocked recv returns ETERM
    loop.join();
  }
  void run() {
    try {
      for (;;) {
        std::vector<zmq::message_t> parts;
        for (;;) {
          zmq::message_t m;
          if (!router.recv(m))
            return;
          const bool more = m.more();
          parts.push_back(std::move(m));
          if (!more)
            break;
        }
        for (size_t k = 0; k < parts.size(); ++k)
          router.send(parts[k], k + 1 < parts.size() ? zmq::send_flags::sndmore
                                                     : zmq::send_flags::none);
      }
    } catch (const zmq::error_t&) {
      // ETERM: shutting down
    }
    router.close();
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
  bool raw = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--raw") {
      raw = true;
      continue;
    }
    if (k == "--grpc")
      grpc_target = v;
    else if (k == "--zmq")
      zmq_ep = v;
    else if (k == "--iters")
      iters = std::max(10, std::atoi(v));
    else if (k == "--reps")
      reps = std::max(1, std::atoi(v));
    ++i;
  }
  if (grpc_target.empty() || zmq_ep.empty()) {
    std::fprintf(stderr, "usage: bench_grpc_rtt --grpc HOST:PORT --zmq tcp://HOST:PORT "
                         "[--iters N] [--reps N] [--raw]\n");
    return 2;
  }
  grpc_client g{grpc_target};
  zmq_client z{zmq_ep};
  std::unique_ptr<raw_grpc_server> rg;
  std::unique_ptr<raw_zmq_server> rz;
  std::unique_ptr<grpc_client> rgc;
  std::unique_ptr<zmq_client> rzc;
  if (raw) {
    rg = std::make_unique<raw_grpc_server>();
    rz = std::make_unique<raw_zmq_server>();
    rgc = std::make_unique<grpc_client>("127.0.0.1:" + std::to_string(rg->port));
    rzc = std::make_unique<zmq_client>(rz->endpoint);
  }
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
  if (raw) {
    block(*rgc, 200, &ok);
    block(*rzc, 200, &ok);
    if (!ok) {
      std::fprintf(stderr, "the raw servers did not answer\n");
      return 1;
    }
  }
  // Which client each block of a round uses; the order turns every round.
  enum { sg, sz, rgr, rzr, sides };
  std::vector<double> p50[sides], p99[sides];
  const int n_sides = raw ? 4 : 2;
  for (int r = 0; r < reps; ++r) {
    for (int k = 0; k < n_sides; ++k) {
      const int side = (k + r) % n_sides;
      std::vector<double> us;
      switch (side) {
      case sg: us = block(g, iters, &ok); break;
      case sz: us = block(z, iters, &ok); break;
      case rgr: us = block(*rgc, iters, &ok); break;
      default: us = block(*rzc, iters, &ok); break;
      }
      if (!ok) {
        std::fprintf(stderr, "a request failed\n");
        return 1;
      }
      p50[side].push_back(pct(us, 0.5));
      p99[side].push_back(pct(us, 0.99));
    }
  }
  const double gm = median(p50[sg]), zm = median(p50[sz]);
  std::printf("RESULT grpc_p50_us=%.1f grpc_p99_us=%.1f zmq_p50_us=%.1f zmq_p99_us=%.1f "
              "ratio_p50=%.2f",
              gm, median(p99[sg]), zm, median(p99[sz]), gm / zm);
  if (raw) {
    const double rgm = median(p50[rgr]), rzm = median(p50[rzr]);
    std::printf(" raw_grpc_p50_us=%.1f raw_grpc_p99_us=%.1f raw_zmq_p50_us=%.1f "
                "raw_zmq_p99_us=%.1f raw_ratio_p50=%.2f grpc_over_raw=%.2f zmq_over_raw=%.2f",
                rgm, median(p99[rgr]), rzm, median(p99[rzr]), rgm / rzm, gm / rgm, zm / rzm);
  }
  std::printf(" reps=%d iters=%d\n", reps, iters);
  return 0;
}
