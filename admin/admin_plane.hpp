// admin_plane: LMCache's HTTP API as the HTTP server's control plane: the
// API-key check and the routes (admin_routes) on the server's loop thread,
// the calls they make answered by the backend on its admin thread.
#pragma once

#include "admin/admin_routes.hpp"
#include "http/control_plane.hpp"

#include <memory>
#include <utility>

namespace kvs {

class admin_plane : public http_control_plane {
public:
  admin_plane(std::shared_ptr<admin_backend> backend, admin_policy policy)
    : backend_(std::move(backend)), policy_(std::move(policy)) {}

  std::optional<http_answer> admit(std::string_view path, std::string_view authorization,
                                   std::string_view api_key) const override {
    return check_api_key(path, authorization, api_key, policy_);
  }

  std::variant<http_answer, deferred> route(std::string_view method, std::string_view path,
                                            std::string_view query, std::string_view body,
                                            std::string_view authorization) override {
    auto r = route_admin(method, path, query, body, authorization, policy_);
    if (auto* a = std::get_if<http_answer>(&r))
      return std::move(*a);
    return deferred{[b = backend_, call = std::move(std::get<admin_call>(r))] {
      return b->serve(call);
    }};
  }

private:
  std::shared_ptr<admin_backend> backend_;
  admin_policy policy_;
};

} // namespace kvs
