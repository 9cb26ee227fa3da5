// "Logged once per kind of failure, and when it recovers", for the calls a
// peer thread makes to the LMCache coordinator (app/coordinator_member,
// app/coordinator_events). A peer that answers garbage answers different
// garbage each time (a body excerpt, a byte count): the kind is the message
// with its digit runs as '#' and without what follows " -- " (the excerpt),
// so a coordinator stuck answering bad JSON is one line, not one a tick.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace kvs {

/// `why` as a kind: digit runs as '#', cut at " -- ".
inline std::string failure_kind(std::string_view why) {
  why = why.substr(0, why.find(" -- "));
  std::string k;
  for (size_t i = 0; i < why.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(why[i]))) {
      if (k.empty() || k.back() != '#')
        k += '#';
    } else {
      k += why[i];
    }
  }
  return k;
}

class peer_failure_log {
public:
  /// True when `why` is of another kind than the last failure (log it).
  bool failed(std::string_view why) {
    auto k = failure_kind(why);
    if (k == last_)
      return false;
    last_ = std::move(k);
    return true;
  }
  /// True when the call before this success had failed (log the recovery).
  bool succeeded() {
    bool was = !last_.empty();
    last_.clear();
    return was;
  }

private:
  std::string last_;
};

} // namespace kvs
