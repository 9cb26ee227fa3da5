#include "actors/zap_handler.hpp"

#include "actors/connection_gate.hpp"
#include "log/log.hpp"

#include <future>

namespace kvs {

namespace {

/// How long one poll round may last: stop() waits up to this for the thread
/// to notice (ZAP requests come once per connection, so a longer wait would
/// save nothing and a shorter one would only wake the thread more often).
constexpr std::chrono::milliseconds stop_check_every{50};

const char* const zap_endpoint = "inproc://zeromq.zap.01";

std::string z85(const std::string& key) {
  if (key.size() != 32)
    return "(" + std::to_string(key.size()) + "-byte key)";
  char out[41] = {};
  zmq_z85_encode(out, reinterpret_cast<const uint8_t*>(key.data()), key.size());
  return out;
}

} // namespace

void serve_curve(zmq::socket_t& s, const std::string& secret_key) {
  if (secret_key.empty())
    return;
  s.set(zmq::sockopt::curve_server, 1);
  s.set(zmq::sockopt::curve_secretkey, zmq::const_buffer(secret_key.data(), secret_key.size()));
  // A domain makes libzmq consult the handler for every connection.
  s.set(zmq::sockopt::zap_domain, "kvsidecar");
}

zap_handler::zap_handler(std::vector<zmq::context_t*> contexts,
                         std::vector<std::string> allowed_keys)
  : contexts_(std::move(contexts)), allowed_keys_(allowed_keys.begin(), allowed_keys.end()),
    label_(log::label("zap_handler", "", 0)) {}

zap_handler::~zap_handler() {
  stop();
}

std::optional<std::string> zap_handler::start() {
  std::promise<std::optional<std::string>> bound;
  auto result = bound.get_future();
  // The sockets are made, used and closed on the handler's thread only (the
  // thread owns the promise too, so start() may return while it sets it).
  thread_ = std::thread([this, bound = std::move(bound)]() mutable {
    std::vector<zmq::socket_t> socks;
    try {
      for (auto* ctx : contexts_) {
        socks.emplace_back(*ctx, zmq::socket_type::rep);
        socks.back().set(zmq::sockopt::linger, 0);
        socks.back().bind(zap_endpoint);
      }
    } catch (const zmq::error_t& e) {
      socks.clear();
      bound.set_value(std::string{"binding the ZAP handler ("} + zap_endpoint + "): " + e.what());
      return;
    }
    bound.set_value(std::nullopt);
    run(socks);
  });
  auto err = result.get();
  if (err) {
    thread_.join();
    return err;
  }
  if (allowed_keys_.empty())
    KVS_INFO(label_, "started: connection limits on every listening socket");
  else
    KVS_INFO(label_, "started: CURVE clients are authorised against {} public keys; connection "
                     "limits on every listening socket", allowed_keys_.size());
  return std::nullopt;
}

void zap_handler::stop() {
  if (!thread_.joinable())
    return;
  stop_ = true;
  thread_.join();
  KVS_INFO(label_, "stopped: {} CURVE clients allowed, {} refused", allowed(), denied());
}

void zap_handler::run(std::vector<zmq::socket_t>& socks) {
  std::vector<zmq::pollitem_t> items;
  for (auto& s : socks)
    items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  while (!stop_) {
    try {
      zmq::poll(items, stop_check_every);
      for (size_t i = 0; i < items.size(); ++i)
        if (items[i].revents & ZMQ_POLLIN)
          answer(socks[i]);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM)
        break;
      KVS_WARN(label_, "ZAP socket error: {}", e.what());
    }
  }
}

void zap_handler::answer(zmq::socket_t& s) {
  // ZAP 1.0 (rfc.zeromq.org/spec/27): version, request id, domain, address,
  // routing id, mechanism, credentials (CURVE: the client's public key).
  std::vector<zmq::message_t> req;
  for (;;) {
    zmq::message_t m;
    if (!s.recv(m, zmq::recv_flags::dontwait))
      break;
    bool more = m.more();
    req.push_back(std::move(m));
    if (!more)
      break;
  }
  if (req.empty())
    return;
  auto frame = [&](size_t i) { return i < req.size() ? req[i].to_string() : std::string{}; };
  auto reply = [&](const char* code, const std::string& text, const std::string& user) {
    std::vector<std::string> r{"1.0", frame(1), code, text, user, ""};
    for (size_t i = 0; i < r.size(); ++i)
      s.send(zmq::buffer(r[i]), i + 1 < r.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  };
  // A gated socket (zmq_bridge::limit_connections) past its cap refuses
  // whoever it is; the gate counts and logs the refusal.
  if (auto gate = find_connection_gate(frame(2)); gate && gate->admit() != 0) {
    reply("400", "too many connections", "");
    return;
  }
  const bool curve = frame(5) == "CURVE" && req.size() >= 7;
  if (frame(0) == "1.0" && frame(5) == "NULL") {
    // Only a gated socket without CURVE asks about NULL peers.
    reply("200", "OK", "");
    return;
  }
  const std::string key = curve ? frame(6) : std::string{};
  const bool ok = frame(0) == "1.0" && curve && allowed_keys_.count(key) > 0;
  reply(ok ? "200" : "400", ok ? "OK" : "client key not allowed", ok ? z85(key) : "");
  if (ok) {
    ++allowed_;
    KVS_DEBUG(label_, "CURVE client {} from {} allowed", z85(key), frame(3));
    return;
  }
  auto n = ++denied_;
  // The first refusals and then one in a thousand: a scanner cannot flood the log.
  if (n <= 10 || n % 1000 == 0)
    KVS_WARN(label_, "{} client {} from {} refused: its key is not in "
                     "security.curve_allowed_clients_dir (#{} refused)",
             curve ? "CURVE" : frame(5), curve ? z85(key) : "-", frame(3), n);
}

} // namespace kvs
