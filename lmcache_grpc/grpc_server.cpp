#include "lmcache_grpc/grpc_server.hpp"

#include "lmcache_grpc/grpc_methods.hpp"
#include "lmcache_grpc/grpc_transcode.hpp"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace kvs {

namespace {

/// As the ZeroMQ endpoint's ZMQ_MAXMSGSIZE.
constexpr int max_message_bytes = 64 << 20;
/// HTTP/2 streams (calls) one connection may have open at once.
constexpr int max_streams_per_connection = 4096;
/// Memory gRPC's core may hold for requests and replies in flight.
constexpr size_t max_buffered_bytes = size_t{2} << 30;
/// Calls accepted ahead of time, so a burst of new RPCs does not wait for
/// the queue to post the next accept one by one.
constexpr int accept_ahead = 8;
/// Clients whose release is remembered (past it the latch is learnt again).
constexpr size_t max_known_clients = 65536;
/// Unanswered requests in the whole server at most.
constexpr size_t max_calls = 65536;
constexpr std::string_view client_id_key = "lmcache-client-id-bin";

/// Whether a process accepts connections on the unix socket at `path`.
bool unix_socket_answers(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path))
    return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

} // namespace

struct grpc_server::impl {
  enum class ev : uint8_t { accepted, read, wrote, finished, done };

  struct call;
  struct tag {
    call* c;
    ev e;
  };

  /// One RPC, from its accept to its done notification.
  struct call {
    grpc::GenericServerContext ctx;
    grpc::GenericServerAsyncReaderWriter stream{&ctx};
    grpc::ByteBuffer in;
    grpc::ByteBuffer out;
    tag t_accepted{this, ev::accepted}, t_read{this, ev::read}, t_wrote{this, ev::wrote},
      t_finished{this, ev::finished}, t_done{this, ev::done};
    const grpc_method* method = nullptr;
    uint64_t id = 0;          ///< the uid of its frames; 0 = not submitted
    std::string uid_frame;    ///< that uid as its frame (stream control echoes it)
    std::string identity;
    std::string op_frame;     ///< the op frame it was submitted with
    int pending = 0;          ///< operations posted and not yet returned
    bool done = false;        ///< the done notification came (call over)
    bool finishing = false;   ///< Finish posted: nothing more to post
    bool writing = false;     ///< a stream Write is in flight
    std::deque<std::string> batches; ///< stream batches waiting for the Write
    std::optional<grpc::Status> end; ///< stream: finish with this after the batches
  };

  grpc_server_params p;
  submit_fn submit;
  reject_fn reject;
  std::string bound;
  grpc_server_counters counters;

  grpc::AsyncGenericService service;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::unique_ptr<grpc::Server> server;
  std::thread thread;

  // Everything below is shared by the queue's thread (handle()) and the
  // thread a reply is delivered on (the engine bridge's): one mutex, never
  // held across a blocking call (posting an operation does not block).
  std::mutex mu;
  bool stopping = false; ///< the queue is (being) shut down: post nothing
  bool stopped = false;

  std::unordered_set<call*> all;                 ///< every live call object
  std::unordered_map<uint64_t, call*> submitted; ///< by uid: awaiting the reply
  std::unordered_map<std::string, client_release> releases;
  std::unordered_map<std::string, int64_t> inflight; ///< per client identity
  uint64_t next_id = 1;

  // -- posting (mu held; never after the queue shut down) ----------------------

  template <class Post>
  bool post(call* c, Post&& op) {
    if (stopping)
      return false;
    ++c->pending;
    op();
    return true;
  }

  void accept_one() {
    auto* c = new call;
    all.insert(c);
    // The done notification comes only for a call that starts (grpc
    // issue 10136): it is counted as pending once the call is accepted.
    c->ctx.AsyncNotifyWhenDone(&c->t_done);
    if (!post(c, [&] {
          service.RequestCall(&c->ctx, &c->stream, cq.get(), cq.get(), &c->t_accepted);
        })) {
      all.erase(c);
      delete c;
    }
  }

  void finish(call* c, const grpc::Status& st) {
    if (c->finishing)
      return;
    c->finishing = true;
    post(c, [&] { c->stream.Finish(st, &c->t_finished); });
  }

  void finish_with(call* c, std::string message) {
    c->finishing = true;
    c->out = to_buffer(message);
    post(c, [&] {
      c->stream.WriteAndFinish(c->out, grpc::WriteOptions{}, grpc::Status::OK, &c->t_finished);
    });
  }

  /// A call refused here, before the engine bridge sees it: counted,
  /// logged (rate-limited by the bridge) and answered `code`, "<op>: <why>"
  /// (or `text`).
  void refuse(call* c, std::atomic<uint64_t>& counter, grpc::StatusCode code,
              std::string_view op, std::string_view kind, const std::string& why,
              std::string text = {}) {
    counter.fetch_add(1, std::memory_order_relaxed);
    if (reject)
      reject(c->ctx.peer(), op, kind, why);
    finish(c, grpc::Status{code, text.empty() ? std::string(op) + ": " + why : std::move(text)});
  }

  static grpc::ByteBuffer to_buffer(const std::string& s) {
    grpc::Slice slice{s.data(), s.size()};
    return grpc::ByteBuffer{&slice, 1};
  }

  // -- the calls' life ------------------------------------------------------------

  void on_accepted(call* c, bool ok) {
    if (!ok) // the server shuts down: no call, no done notification
      return;
    ++c->pending; // the done notification
    counters.calls.fetch_add(1, std::memory_order_relaxed);
    accept_one();
    c->method = find_grpc_method(c->ctx.method());
    if (!c->method) {
      refuse(c, counters.unimplemented, grpc::StatusCode::UNIMPLEMENTED,
             std::string_view{c->ctx.method()}.substr(0, 128), "unimplemented",
             "no such LMCache method",
             c->ctx.method() + " is not served by kvsidecar (LMCache MP ops only; "
                               "docs/lmcache-mp-compat.md)");
      return;
    }
    post(c, [&] { c->stream.Read(&c->in, &c->t_read); });
  }

  std::string client_of(call* c) {
    const auto& md = c->ctx.client_metadata();
    auto it = md.find(grpc::string_ref{client_id_key.data(), client_id_key.size()});
    if (it != md.end() && it->second.size() > 0 && it->second.size() <= 64)
      return grpc_identity(std::string_view{it->second.data(), it->second.size()});
    return grpc_identity(c->ctx.peer());
  }

  void on_read(call* c, bool ok) {
    if (!ok) { // the client closed without a message, or went away
      // Gone before its request: counted with the calls cancelled before
      // their answer, so that every call is accounted for.
      counters.cancelled.fetch_add(1, std::memory_order_relaxed);
      finish(c, grpc::Status{grpc::StatusCode::INVALID_ARGUMENT,
                             std::string(op_name(*c->method)) + ": no request message"});
      return;
    }
    std::string bytes;
    {
      std::vector<grpc::Slice> slices;
      if (!c->in.Dump(&slices).ok()) {
        counters.bad_requests.fetch_add(1, std::memory_order_relaxed);
        finish(c, grpc::Status{grpc::StatusCode::INTERNAL, "unreadable request"});
        return;
      }
      bytes.reserve(c->in.Length());
      for (auto& s : slices)
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      c->in.Clear();
    }
    c->identity = client_of(c);
    const auto& m = *c->method;
    client_release dialect = m.release;
    if (m.release != client_release::unknown) {
      if (releases.size() >= max_known_clients)
        releases.clear();
      releases[c->identity] = m.release;
    } else if (auto r = releases.find(c->identity); r != releases.end()) {
      dialect = r->second;
    }
    auto busy = inflight.find(c->identity);
    if ((busy != inflight.end() && busy->second >= p.max_inflight) || submitted.size() >= max_calls) {
      refuse(c, counters.overloaded, grpc::StatusCode::RESOURCE_EXHAUSTED, op_name(m),
             "overloaded",
             "more than cache.hwm (" + std::to_string(p.max_inflight)
               + ") requests of this client are unanswered");
      return;
    }
    const uint64_t id = next_id++;
    auto frames = grpc_request_frames(m, bytes, dialect, id);
    if (!frames) {
      refuse(c, counters.bad_requests, grpc::StatusCode::INVALID_ARGUMENT, op_name(m),
             frames.error_value().kind, frames.error_value().detail);
      return;
    }
    ++inflight[c->identity];
    c->id = id;
    c->uid_frame = (*frames)[0];
    c->op_frame = (*frames)[1];
    submitted.emplace(id, c);
    if (m.subscribe)
      counters.streams.fetch_add(1, std::memory_order_relaxed);
    submit(lmcache_frames{c->identity, std::move(*frames), std::chrono::steady_clock::now(),
                          c->ctx.peer()});
  }

  /// The call will get no (more) replies: forget its uid.
  void unsubmit(call* c) {
    if (c->id == 0)
      return;
    submitted.erase(c->id);
    if (auto it = inflight.find(c->identity); it != inflight.end() && --it->second <= 0)
      inflight.erase(it);
    if (c->method && c->method->subscribe)
      counters.streams.fetch_sub(1, std::memory_order_relaxed);
    c->id = 0;
  }

  void control(call* c, std::string_view action) {
    std::vector<std::string> frames{c->uid_frame, std::string{}, std::string{action}};
    submit(lmcache_frames{c->identity, std::move(frames), std::chrono::steady_clock::now()});
  }

  void on_reply(mp_reply& r) {
    auto id = grpc_call_id(r.uid_frame);
    auto it = id ? submitted.find(*id) : submitted.end();
    if (it == submitted.end())
      return; // cancelled, or ended by the client: nobody waits for it
    call* c = it->second;
    const auto& m = *c->method;
    if (r.op_frame != c->op_frame) {
      // The failure reply (lmcache_wire/lmcache_failure.hpp): its op frame
      // is the reason, as msgpack str "kvsidecar: ...".
      counters.failed.fetch_add(1, std::memory_order_relaxed);
      std::string why = grpc_failure_text(r.op_frame);
      unsubmit(c);
      finish(c, grpc::Status{grpc::StatusCode::FAILED_PRECONDITION, why});
      return;
    }
    if (!m.subscribe) {
      auto out = grpc_response(m, r.body);
      unsubmit(c);
      if (!out) {
        counters.failed.fetch_add(1, std::memory_order_relaxed);
        finish(c, grpc::Status{grpc::StatusCode::INTERNAL, out.error_value().detail});
        return;
      }
      counters.replies.fetch_add(1, std::memory_order_relaxed);
      finish_with(c, std::move(*out));
      return;
    }
    // A stream: a batch, or (no body) its end.
    if (!r.body) {
      unsubmit(c);
      c->end = grpc::Status::OK;
    } else {
      auto batch = grpc_kv_event_batch(*r.body);
      if (!batch) {
        unsubmit(c);
        c->end = grpc::Status{grpc::StatusCode::INTERNAL, batch.error_value().detail};
      } else {
        c->batches.push_back(std::move(*batch));
      }
    }
    pump(c);
  }

  /// A stream's next Write, or its Finish once every batch is out.
  void pump(call* c) {
    if (c->writing || c->finishing || c->done)
      return;
    if (!c->batches.empty()) {
      c->out = to_buffer(c->batches.front());
      c->batches.pop_front();
      c->writing = true;
      post(c, [&] { c->stream.Write(c->out, &c->t_wrote); });
      return;
    }
    if (c->end)
      finish(c, *c->end);
  }

  void on_wrote(call* c, bool ok) {
    c->writing = false;
    if (!ok) {
      // The client is gone (a write held by flow control fails when it
      // dies): end its subscription now, as its done notification would.
      if (c->id != 0) {
        counters.cancelled.fetch_add(1, std::memory_order_relaxed);
        control(c, "cancel");
        unsubmit(c);
      }
      return;
    }
    counters.replies.fetch_add(1, std::memory_order_relaxed);
    // gRPC's flow control stands in for LMCache's ZeroMQ ack frame: the
    // next batch may go once this one is written.
    if (c->id != 0)
      control(c, "ack");
    pump(c);
  }

  void on_done(call* c) {
    c->done = true;
    if (c->id != 0) {
      // Gone before its answer: a stream is cancelled in the engine bridge
      // (as LMCache's cancel frame); a unary reply will find no call.
      counters.cancelled.fetch_add(1, std::memory_order_relaxed);
      if (c->method->subscribe)
        control(c, "cancel");
      unsubmit(c);
    }
  }

  void handle(tag* t, bool ok) {
    std::lock_guard<std::mutex> lock{mu};
    call* c = t->c;
    --c->pending;
    switch (t->e) {
      case ev::accepted: on_accepted(c, ok); break;
      case ev::read: on_read(c, ok); break;
      case ev::wrote: on_wrote(c, ok); break;
      case ev::finished: break;
      case ev::done: on_done(c); break;
    }
    // Gone when nothing posted for it is left to return (the done
    // notification included, once it started).
    if (c->pending == 0) {
      unsubmit(c);
      all.erase(c);
      delete c;
    }
  }

  void run() {
    void* raw = nullptr;
    bool ok = false;
    while (cq->Next(&raw, &ok))
      handle(static_cast<tag*>(raw), ok);
  }
};

grpc_server::grpc_server(grpc_server_params params, submit_fn submit, reject_fn reject)
  : impl_(std::make_unique<impl>()) {
  impl_->p = std::move(params);
  impl_->submit = std::move(submit);
  impl_->reject = std::move(reject);
}

grpc_server::~grpc_server() {
  stop();
}

const std::string& grpc_server::bound() const {
  return impl_->bound;
}

const grpc_server_counters& grpc_server::counters() const {
  return impl_->counters;
}

std::optional<std::string> grpc_server::start() {
  auto& d = *impl_;
  const auto& ep = d.p.endpoint;
  std::string address;
  std::string unix_path;
  if (ep.rfind("grpc://", 0) == 0) {
    address = ep.substr(7);
  } else if (ep.rfind("grpc+unix://", 0) == 0) {
    unix_path = ep.substr(12);
    if (unix_path.empty() || unix_path[0] != '/')
      return "cache.grpc_endpoint = \"" + ep + "\": expected an absolute path after grpc+unix://";
    address = "unix:" + unix_path;
    // A socket left by a process that is gone is replaced; one a live
    // server answers on, or anything else, is not ours to take.
    struct stat st {};
    if (::lstat(unix_path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode))
        return "cache.grpc_endpoint = \"" + ep + "\": " + unix_path
               + " exists and is not a socket";
      if (unix_socket_answers(unix_path))
        return "cache.grpc_endpoint = \"" + ep + "\": another server is listening on "
               + unix_path;
      ::unlink(unix_path.c_str());
    }
  } else {
    return "cache.grpc_endpoint = \"" + ep + "\": expected grpc://host:port or grpc+unix:///path";
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!d.p.tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back({d.p.tls_key_pem, d.p.tls_cert_pem});
    if (!d.p.tls_client_ca_pem.empty()) {
      opts.pem_root_certs = d.p.tls_client_ca_pem;
      opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(opts);
  }
  silence_protobuf_log();
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(address, creds, unix_path.empty() ? &port : nullptr);
  b.SetMaxReceiveMessageSize(max_message_bytes);
  b.SetMaxSendMessageSize(max_message_bytes);
  // What one client can make the server hold: calls at once per connection
  // (each may carry a 64 MiB message), and the memory gRPC's core buffers
  // for all of them together (past it, new calls are refused, not queued).
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, max_streams_per_connection);
  grpc::ResourceQuota quota{"kvsidecar-grpc"};
  quota.Resize(max_buffered_bytes);
  b.SetResourceQuota(quota);
  b.RegisterAsyncGenericService(&d.service);
  d.cq = b.AddCompletionQueue();
  d.server = b.BuildAndStart();
  if (!d.server || (unix_path.empty() && port == 0)) {
    d.server.reset();
    d.cq->Shutdown();
    void* t = nullptr;
    bool ok = false;
    while (d.cq->Next(&t, &ok)) {
    }
    d.cq.reset();
    return "cache.grpc_endpoint = \"" + ep + "\": cannot listen on " + address
           + " (in use, or not an address of this host)";
  }
  if (!unix_path.empty()) {
    // Only the sidecar's user may connect (the peer-credential rule of the
    // ipc:// endpoint, by file mode).
    ::chmod(unix_path.c_str(), 0600);
    d.bound = ep;
  } else {
    auto colon = address.rfind(':');
    d.bound = "grpc://" + address.substr(0, colon) + ":" + std::to_string(port);
  }
  {
    std::lock_guard<std::mutex> lock{d.mu};
    for (int i = 0; i < accept_ahead; ++i)
      d.accept_one();
  }
  d.thread = std::thread([&d] { d.run(); });
  return std::nullopt;
}

void grpc_server::deliver(mp_reply r) {
  // On the caller's thread: the write is posted from here, so a reply
  // never waits for the queue's thread to wake up first.
  auto& d = *impl_;
  std::lock_guard<std::mutex> lock{d.mu};
  if (d.stopping || !d.server)
    return;
  d.on_reply(r);
}

void grpc_server::stop() {
  auto& d = *impl_;
  if (!d.server || d.stopped)
    return;
  d.stopped = true;
  // Cancels what is in flight (after a short grace for replies already on
  // their way); the queue keeps being drained by its thread meanwhile.
  d.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  {
    std::lock_guard<std::mutex> lock{d.mu};
    d.stopping = true;
    d.cq->Shutdown();
  }
  if (d.thread.joinable())
    d.thread.join();
  std::lock_guard<std::mutex> lock{d.mu};
  for (auto* c : d.all)
    delete c;
  d.all.clear();
  d.submitted.clear();
}

} // namespace kvs
