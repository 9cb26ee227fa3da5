// http_answer: what the HTTP server writes back for a request it did not
// answer itself. A message too: the admin actor answers each control-plane
// call with one (actors/interfaces.hpp, admin_actor), so it lives here, below
// both the actors and http/.
#pragma once

#include <string>

namespace kvs {

struct http_answer {
  int status = 200;
  std::string body; ///< JSON unless content_type says otherwise
  std::string content_type = "application/json";
};

} // namespace kvs
