// grpc_server: LMCache's gRPC transport at the edge (cache.grpc_endpoint).
//
// Owns the grpc::Server and its one completion queue, polled on its own
// thread with no timeout (xeus-zmq style: nothing else touches them). Every
// method is served through grpc's generic service, so both LMCache
// releases' service names (grpc_methods.hpp) reach one table. A request is
// turned into the frames a ZeroMQ client sends (grpc_transcode.hpp) and
// handed to `submit` (the gRPC bridge actor forwards it to the engine
// bridge); the reply comes back through deliver(), on the engine bridge's
// thread, which posts its write at once.
//
// Limits as on the ZeroMQ endpoint: requests of at most 64 MiB; at most
// `max_inflight` unanswered requests per client (cache.hwm; past it the
// call fails RESOURCE_EXHAUSTED at once); a client is the
// lmcache-client-id-bin metadata LMCache sends on every call, else its peer
// address. Shutdown is a handshake: stop() shuts the server down (in-flight
// calls are cancelled), then the queue, drains it on its thread and joins,
// so no call or queue outlives the thread.
//
// No gRPC headers here (pimpl): only grpc_server.cpp compiles them.
#pragma once

#include "messages/cache_messages.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace kvs {

struct grpc_server_params {
  std::string endpoint;   ///< grpc://host:port or grpc+unix:///abs/path
  int64_t max_inflight = 0; ///< unanswered requests per client (cache.hwm)
  std::string tls_cert_pem; ///< PEM certificate chain; with tls_key_pem: TLS on grpc://
  std::string tls_key_pem;
  std::string tls_client_ca_pem; ///< PEM; set: clients must present a certificate it signed
};

/// Counters, read from any thread (the bridge's stats line, /metrics).
struct grpc_server_counters {
  std::atomic<uint64_t> calls{0};          ///< RPCs accepted
  std::atomic<uint64_t> unimplemented{0};  ///< a path LMCache's table has not
  std::atomic<uint64_t> bad_requests{0};   ///< a message that did not transcode
  std::atomic<uint64_t> overloaded{0};     ///< refused: the client's in-flight limit
  std::atomic<uint64_t> failed{0};         ///< answered with the server's failure reply
  std::atomic<uint64_t> replies{0};        ///< answered OK (a stream: each batch)
  std::atomic<uint64_t> cancelled{0};      ///< the client went away before its answer
  std::atomic<int64_t> streams{0};         ///< open subscribe_kv_events streams
};

class grpc_server final : public lmcache_reply_sink {
public:
  using submit_fn = std::function<void(lmcache_frames)>;
  /// A call refused here, before the engine bridge saw it (bad message,
  /// unknown path, over the in-flight limit): peer, op, kind, why. Called
  /// on the completion queue's thread, one call at a time.
  using reject_fn = std::function<void(const std::string& peer, std::string_view op,
                                       std::string_view kind, const std::string& why)>;

  grpc_server(grpc_server_params params, submit_fn submit, reject_fn reject = {});
  ~grpc_server() override; ///< stop()
  grpc_server(const grpc_server&) = delete;
  grpc_server& operator=(const grpc_server&) = delete;

  /// Binds and starts the queue's thread; the error names the endpoint.
  std::optional<std::string> start();
  /// What it listens on: "grpc://127.0.0.1:40123", "grpc+unix:///run/kvs.sock".
  const std::string& bound() const;
  /// The reply to a request this server submitted (any thread; the write
  /// is posted on the caller's).
  void deliver(mp_reply r) override;
  /// The shutdown handshake (idempotent).
  void stop();
  const grpc_server_counters& counters() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace kvs
