#include "http/http_answer.hpp"

#include "http/json_text.hpp"

namespace kvs {

http_answer http_error(int status, std::string_view why) {
  json_writer w;
  w.begin_object().str("error", why).str("detail", why).end_object();
  return {status, w.take()};
}

} // namespace kvs
