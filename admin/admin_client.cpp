#include "admin/admin_client.hpp"

#include "admin/admin_actor.hpp"
#include "http/http_answer.hpp"

#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <cstdlib>
#include <variant>

namespace kvs {

admin_client::admin_client(caf::actor_system& sys, const config& cfg)
  : sys_(sys),
    // Detached: MD5 of up to admin_checksum_max_bytes runs on it.
    admin_(sys.spawn<caf::detached>(admin, admin_params{&cfg, cfg.sidecar.stats_interval})) {}

admin_client::~admin_client() {
  caf::anon_send_exit(admin_, caf::exit_reason::user_shutdown);
}

void admin_client::watch(store_actor store, l2_actor l2, gpu_transfer_actor gpu) {
  caf::anon_send(admin_, watch_atom_v, std::move(store), std::move(l2), std::move(gpu));
}

http_answer admin_client::serve(const admin_call& call) {
  http_answer out = http_error(504, "the admin actor did not answer");
  caf::scoped_actor self{sys_};
  std::visit(
    [&](const auto& c) {
      self->request(admin_, admin_call_timeout, c)
        .receive([&](http_answer& a) { out = std::move(a); },
                 [&](caf::error& e) {
                   out = e == caf::sec::request_timeout
                           ? http_error(504, "the admin actor did not answer within "
                                               + std::to_string(admin_call_timeout.count())
                                               + " s (busy?): try again")
                           : http_error(503, "the admin actor is gone: " + caf::to_string(e));
                 });
    },
    call);
  return out;
}

admin_policy admin_policy_of(const config& cfg) {
  admin_policy p;
  auto host = cfg.http.listen.substr(0, cfg.http.listen.rfind(':'));
  p.loopback = host.rfind("127.", 0) == 0 || host == "[::1]";
  p.token = cfg.http.admin_token;
  if (p.token.empty())
    if (const char* env = std::getenv("KVSIDECAR_ADMIN_TOKEN"))
      p.token = env;
  return p;
}

} // namespace kvs
