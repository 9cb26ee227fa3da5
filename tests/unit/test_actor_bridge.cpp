// The zmq_bridge base: a typed message wakes its zmq_poll at once (eventfd,
// no timeout), socket input reaches its handler, and the stop handshake
// drains, closes the sockets on the bridge's thread and acknowledges.
#include "actors/interfaces.hpp"
#include "actors/zmq_bridge.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>

using namespace kvs;
using namespace std::chrono_literals;

namespace {

std::atomic<int> drained{0};
std::atomic<int> socket_events{0};

// Echoes every `publish_atom, encoded_batch` as one frame on an inproc PAIR,
// and counts frames it receives on it.
/// The echo bridge's interface: one message of its own besides the built-ins.
using echo_bridge_actor =
  caf::typed_actor<caf::reacts_to<publish_atom, encoded_batch>>::extend_with<bridge_actor>;

class echo_bridge : public zmq_bridge {
public:
  echo_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor sup, std::string ep)
    : zmq_bridge(cfg, ctx, "echo", "test", std::move(sup), 0ns), ep_(std::move(ep)) {}

protected:
  std::optional<std::string> open() override {
    pair_ = zmq::socket_t{ctx_, zmq::socket_type::pair};
    own(pair_);
    auto r = open_endpoint(pair_, ep_, false);
    if (!r.ok)
      return r.endpoint;
    watch(pair_, ZMQ_POLLIN);
    return std::nullopt;
  }
  caf::behavior handlers() override {
    return typed_handlers<echo_bridge_actor>([this](publish_atom, const encoded_batch& b) {
      pair_.send(zmq::buffer(*b.payload), zmq::send_flags::none);
    });
  }
  void on_socket(size_t, short) override {
    zmq::message_t m;
    while (pair_.recv(m, zmq::recv_flags::dontwait))
      ++socket_events;
  }
  void drain() override {
    ++drained;
  }

private:
  std::string ep_;
  zmq::socket_t pair_;
};

} // namespace

TEST_CASE("bridge: message wake-up, socket input, stop handshake") {
  zmq::context_t ctx{1};
  caf::actor_system_config cfg;
  {
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    auto b = sys.spawn<echo_bridge, caf::detached>(ctx, caf::actor{self}, "inproc://bridge-test");
    bool ready = false;
    self->receive([&](ready_atom, const std::string& label) {
      ready = true;
      CHECK(label.rfind("echo[test]#", 0) == 0);
    }, caf::after(5s) >> [] {});
    REQUIRE(ready);
    // inproc:// binds by vLLM's rule: the bridge bound, the peer connects.
    zmq::socket_t peer{ctx, zmq::socket_type::pair};
    peer.connect("inproc://bridge-test");

    // A typed message wakes the poll with no socket activity at all.
    for (int i = 0; i < 100; ++i) {
      auto payload = std::make_shared<const std::string>("m" + std::to_string(i));
      auto t0 = std::chrono::steady_clock::now();
      self->send(b, publish_atom_v, encoded_batch{uint64_t(i), payload});
      zmq::pollitem_t it{peer.handle(), 0, ZMQ_POLLIN, 0};
      REQUIRE(zmq::poll(&it, 1, std::chrono::milliseconds{5000}) == 1);
      zmq::message_t m;
      REQUIRE(peer.recv(m));
      CHECK(m.to_string() == *payload);
      // Far below any polling interval a timeout-based loop would need.
      CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    }

    // Socket input reaches on_socket.
    for (int i = 0; i < 10; ++i)
      peer.send(zmq::str_buffer("x"), zmq::send_flags::none);
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (socket_events < 10 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    CHECK(socket_events == 10);

    // Stop handshake: drain, close on the bridge's thread, acknowledge, exit.
    self->monitor(b);
    self->send(b, stop_atom_v);
    bool acked = false;
    bool down = false;
    for (int i = 0; i < 2; ++i)
      self->receive([&](stop_atom, const std::string&) { acked = true; },
                    [&](caf::down_msg&) { down = true; }, caf::after(5s) >> [] {});
    CHECK(acked);
    CHECK(down);
    CHECK(drained == 1);
  }
  ctx.close(); // returns only when every socket is closed
}

TEST_CASE("bridge: a failed open reports failed_atom with the reason") {
  zmq::context_t ctx{1};
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto b = sys.spawn<echo_bridge, caf::detached>(ctx, caf::actor{self}, "bogus://nowhere");
  std::string why;
  self->receive([&](failed_atom, const std::string&, const std::string& w) { why = w; },
                caf::after(5s) >> [] {});
  CHECK(why.find("bogus://nowhere") != std::string::npos);
}
