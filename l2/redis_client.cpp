#include "l2/redis_client.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

namespace kvs {

namespace {

using clock_type = std::chrono::steady_clock;

uint16_t crc16_xmodem(const char* p, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(p[i])) << 8;
    for (int b = 0; b < 8; ++b)
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return crc;
}

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

bool split_endpoint(const std::string& ep, std::string* host, int* port) {
  auto colon = ep.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == ep.size())
    return false;
  *host = ep.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  char* end = nullptr;
  long p = std::strtol(ep.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 1 || p > 65535)
    return false;
  *port = static_cast<int>(p);
  return true;
}

struct reply_deleter {
  void operator()(redisReply* r) const {
    if (r)
      freeReplyObject(r);
  }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

std::string flatten(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      return std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER:
      return std::to_string(r->integer);
    case REDIS_REPLY_NIL:
      return "(nil)";
    case REDIS_REPLY_ARRAY: {
      std::string out;
      for (size_t i = 0; i < r->elements; ++i)
        out += (i ? " " : "") + flatten(r->element[i]);
      return out;
    }
  }
  return {};
}

/// hiredis's error text, with its socket timeout (EAGAIN's "Resource
/// temporarily unavailable") said as what it is.
std::string hiredis_error(const redisContext* c, std::chrono::milliseconds timeout) {
  if (c->err == REDIS_ERR_IO && std::string_view(c->errstr) == std::strerror(EAGAIN))
    return "no reply within " + std::to_string(timeout.count()) + " ms";
  return c->errstr;
}

} // namespace

uint16_t redis_key_slot(std::string_view key) {
  // Hash tag: the part between the first '{' and the next '}', if not empty.
  auto open = key.find('{');
  if (open != std::string_view::npos) {
    auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return crc16_xmodem(key.data(), key.size()) & 16383;
}

struct redis_client::node {
  std::string endpoint;
  std::string host;
  int port = 0;
  bool valid = false;
  std::vector<redisContext*> conns;
  clock_type::time_point retry_at{};
};

enum class op_kind { get, set, exists };

struct redis_client::op {
  op_kind kind;
  const std::string* key;
  std::string_view head;  ///< SET: sent before `value`, as one value
  std::string_view value;
  std::string ask_to; ///< set by an ASK redirect: the next try goes there
  bool done = false;
  bool ok = false;
  std::string* dst = nullptr; ///< GET: where the value is read to
};

redis_client::redis_client(redis_options opts)
    : opts_(std::move(opts)), reader_(opts_.max_value_bytes, opts_.timeout) {
  opts_.connections = std::max(1, opts_.connections);
  for (auto& ep : opts_.endpoints)
    node_at(ep);
  slots_.assign(16384, -1);
}

redis_client::~redis_client() {
  for (auto& n : nodes_)
    for (auto* c : n->conns)
      if (c)
        redisFree(c);
}

size_t redis_client::node_count() const {
  return nodes_.size();
}

redis_client::node* redis_client::node_at(const std::string& endpoint) {
  for (auto& n : nodes_)
    if (n->endpoint == endpoint)
      return n.get();
  auto n = std::make_unique<node>();
  n->endpoint = endpoint;
  n->valid = split_endpoint(endpoint, &n->host, &n->port);
  n->conns.assign(static_cast<size_t>(opts_.connections), nullptr);
  nodes_.push_back(std::move(n));
  return nodes_.back().get();
}

void redis_client::fail_node(node& n, const std::string& why) {
  for (auto*& c : n.conns) {
    if (c)
      redisFree(c);
    c = nullptr;
  }
  n.retry_at = clock_type::now() + opts_.retry_after;
  slots_stale_ = true;
  last_error_ = n.endpoint + ": " + why;
}

redisContext* redis_client::connection(node& n, size_t i) {
  if (n.conns[i])
    return n.conns[i];
  if (!n.valid || clock_type::now() < n.retry_at)
    return nullptr;
  auto tv = to_timeval(opts_.timeout);
  redisContext* c = redisConnectWithTimeout(n.host.c_str(), n.port, tv);
  if (!c || c->err) {
    ++stats_.connect_failures;
    fail_node(n, std::string{"connect: "} + (c ? c->errstr : "out of memory"));
    if (c)
      redisFree(c);
    return nullptr;
  }
  redisSetTimeout(c, tv);
  redisEnableKeepAlive(c);
  if (!opts_.password.empty()) {
    const char* argv[] = {"AUTH", opts_.password.c_str()};
    size_t lens[] = {4, opts_.password.size()};
    reply_ptr r{static_cast<redisReply*>(redisCommandArgv(c, 2, argv, lens))};
    if (!r || r->type == REDIS_REPLY_ERROR) {
      ++stats_.connect_failures;
      std::string why = r ? std::string(r->str, r->len) : hiredis_error(c, opts_.timeout);
      redisFree(c);
      fail_node(n, "AUTH: " + why);
      return nullptr;
    }
  }
  ++stats_.connects;
  n.conns[i] = c;
  return c;
}

void redis_client::refresh_slots() {
  auto now = clock_type::now();
  // At most one refresh per 100 ms: a storm of MOVED replies costs one.
  if (last_refresh_ != clock_type::time_point{} && now - last_refresh_ < std::chrono::milliseconds(100))
    return;
  last_refresh_ = now;
  // Ask the known nodes, then the configured seeds, until one answers.
  std::vector<node*> order;
  for (auto& n : nodes_)
    order.push_back(n.get());
  for (auto* n : order) {
    auto* c = connection(*n, 0);
    if (!c)
      continue;
    reply_ptr r{static_cast<redisReply*>(redisCommand(c, "CLUSTER SLOTS"))};
    if (!r) {
      fail_node(*n, "CLUSTER SLOTS: " + hiredis_error(c, opts_.timeout));
      continue;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
      last_error_ = n->endpoint + ": CLUSTER SLOTS: " + flatten(r.get());
      continue;
    }
    std::vector<int32_t> fresh(16384, -1);
    std::string asked_host = n->host;
    for (size_t i = 0; i < r->elements; ++i) {
      auto* range = r->element[i];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3)
        continue;
      auto* master = range->element[2];
      if (master->type != REDIS_REPLY_ARRAY || master->elements < 2
          || master->element[0]->type != REDIS_REPLY_STRING
          || master->element[1]->type != REDIS_REPLY_INTEGER)
        continue;
      std::string host(master->element[0]->str, master->element[0]->len);
      if (host.empty() || host == "?")
        host = asked_host; // "the node you asked" (Redis 7 with no announced host)
      auto ep = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":"
                + std::to_string(master->element[1]->integer);
      node_at(ep);
      int32_t idx = -1;
      for (size_t k = 0; k < nodes_.size(); ++k)
        if (nodes_[k]->endpoint == ep)
          idx = static_cast<int32_t>(k);
      auto lo = std::clamp<long long>(range->element[0]->integer, 0, 16383);
      auto hi = std::clamp<long long>(range->element[1]->integer, 0, 16383);
      for (auto s = lo; s <= hi; ++s)
        fresh[static_cast<size_t>(s)] = idx;
    }
    slots_ = std::move(fresh);
    slots_stale_ = false;
    ++stats_.slot_refreshes;
    return;
  }
}

redis_client::node* redis_client::node_for(std::string_view key) {
  if (nodes_.empty())
    return nullptr;
  auto slot = redis_key_slot(key);
  if (!opts_.cluster)
    return nodes_[slot % opts_.endpoints.size()].get(); // client-side sharding
  auto idx = slots_[slot];
  return idx >= 0 ? nodes_[static_cast<size_t>(idx)].get() : nodes_.front().get();
}

void redis_client::run(std::vector<op>& ops) {
  for (int round = 0; round < 5; ++round) {
    if (opts_.cluster && slots_stale_)
      refresh_slots();
    // Group the pending ops by (node, connection); write all, then read all.
    struct lane {
      node* n;
      size_t conn;
      std::vector<op*> ops;
    };
    std::vector<lane> lanes;
    std::unordered_map<node*, size_t> next_conn;
    bool pending = false;
    for (auto& o : ops) {
      if (o.done)
        continue;
      pending = true;
      node* n = o.ask_to.empty() ? node_for(*o.key) : node_at(o.ask_to);
      if (!n) {
        o.done = true;
        ++stats_.unreachable;
        continue;
      }
      size_t conn = next_conn[n]++ % static_cast<size_t>(opts_.connections);
      auto it = std::find_if(lanes.begin(), lanes.end(),
                             [&](const lane& l) { return l.n == n && l.conn == conn; });
      if (it == lanes.end()) {
        lanes.push_back({n, conn, {}});
        it = std::prev(lanes.end());
      }
      it->ops.push_back(&o);
    }
    if (!pending)
      return;
    std::string px = std::to_string(opts_.ttl.count());
    for (auto& l : lanes) {
      auto* c = connection(*l.n, l.conn);
      if (!c) {
        for (auto* o : l.ops) {
          o->done = true;
          ++stats_.unreachable;
        }
        l.ops.clear();
        continue;
      }
      for (auto* o : l.ops) {
        if (!o->ask_to.empty())
          writer_.command({"ASKING"});
        if (o->kind == op_kind::get)
          writer_.command({"GET", *o->key});
        else if (o->kind == op_kind::exists)
          writer_.command({"EXISTS", *o->key});
        else if (opts_.ttl.count() > 0)
          writer_.command({"SET", *o->key, {o->head, o->value}, "PX", px});
        else
          writer_.command({"SET", *o->key, {o->head, o->value}});
      }
      // Send now so every node works on its share while we read the others.
      if (auto sent = writer_.flush(c->fd); !sent)
        fail_node(*l.n, "write: " + sent.error_value().detail); // its lane is failed below
    }
    resp_reply r;
    for (auto& l : lanes) {
      auto* c = l.n->conns[l.conn];
      std::string why;
      size_t i = 0;
      for (; c && i < l.ops.size(); ++i) {
        auto* o = l.ops[i];
        if (!o->ask_to.empty()) {
          if (auto got = reader_.next(c->fd, r); !got) {
            why = got.error_value().detail;
            break;
          }
          o->ask_to.clear(); // +OK of ASKING
        }
        if (auto got = reader_.next(c->fd, r, o->dst); !got) {
          why = got.error_value().detail;
          break;
        }
        if (r.type == resp_reply::kind::error) {
          std::string_view e = r.text;
          bool moved = e.rfind("MOVED ", 0) == 0;
          bool ask = e.rfind("ASK ", 0) == 0;
          if (moved || ask) {
            auto sp = e.rfind(' ');
            std::string ep(e.substr(sp + 1));
            if (moved) {
              ++stats_.moved;
              auto slot = redis_key_slot(*o->key);
              node_at(ep);
              for (size_t k = 0; k < nodes_.size(); ++k)
                if (nodes_[k]->endpoint == ep)
                  slots_[slot] = static_cast<int32_t>(k);
              slots_stale_ = true; // the topology changed: refresh the rest too
            } else {
              ++stats_.asked;
              o->ask_to = ep;
            }
            continue; // retried next round
          }
          ++stats_.errors;
          last_error_ = l.n->endpoint + ": " + r.text;
          o->done = true;
          continue;
        }
        o->done = true;
        if (o->kind == op_kind::get) {
          o->ok = r.type == resp_reply::kind::bulk;
        } else if (o->kind == op_kind::exists) {
          o->ok = r.type == resp_reply::kind::integer && r.integer > 0;
        } else {
          o->ok = r.type == resp_reply::kind::status;
        }
      }
      if (i < l.ops.size()) {
        // The connection broke mid-pipeline: the rest of the lane is lost.
        if (c)
          fail_node(*l.n, "read: " + why);
        for (; i < l.ops.size(); ++i) {
          l.ops[i]->done = true;
          ++stats_.errors;
        }
      } else if (c && reader_.buffered() > 0) {
        // Bytes after the last reply: the stream is out of step with our
        // requests. The replies read are kept; the connection is not.
        fail_node(*l.n, "read: " + std::to_string(reader_.buffered())
                          + " bytes nobody asked for after the last reply");
      }
      reader_.clear();
    }
  }
  for (auto& o : ops)
    if (!o.done) {
      o.done = true; // redirected too often
      ++stats_.errors;
    }
}

std::vector<bool> redis_client::get_into(const std::vector<std::string>& keys,
                                         std::vector<std::string>& values) {
  values.resize(keys.size());
  std::vector<op> ops;
  ops.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    ops.push_back(op{op_kind::get, &keys[i], {}, {}, {}, false, false, &values[i]});
  run(ops);
  std::vector<bool> hit;
  hit.reserve(keys.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    ++stats_.gets;
    if (ops[i].ok)
      ++stats_.get_hits;
    else
      values[i].clear(); // a failure may have left part of a value
    hit.push_back(ops[i].ok);
  }
  return hit;
}

std::vector<std::optional<std::string>> redis_client::get(const std::vector<std::string>& keys) {
  std::vector<std::string> values;
  auto hit = get_into(keys, values);
  std::vector<std::optional<std::string>> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    if (hit[i])
      out[i] = std::move(values[i]);
  return out;
}

std::vector<bool> redis_client::exists(const std::vector<std::string>& keys) {
  std::vector<op> ops;
  ops.reserve(keys.size());
  for (auto& k : keys)
    ops.push_back(op{op_kind::exists, &k, {}, {}, {}, false, false, nullptr});
  run(ops);
  std::vector<bool> out;
  for (auto& o : ops) {
    ++stats_.exists;
    out.push_back(o.ok);
  }
  return out;
}

std::vector<bool> redis_client::set(const std::vector<std::string>& keys,
                                    const std::vector<std::string_view>& values,
                                    const std::vector<std::string_view>& heads) {
  std::vector<op> ops;
  ops.reserve(keys.size());
  for (size_t i = 0; i < keys.size() && i < values.size(); ++i)
    ops.push_back(op{op_kind::set, &keys[i], i < heads.size() ? heads[i] : std::string_view{},
                     values[i], {}, false, false, nullptr});
  run(ops);
  std::vector<bool> out;
  for (auto& o : ops) {
    ++stats_.sets;
    if (o.ok)
      ++stats_.set_ok;
    out.push_back(o.ok);
  }
  return out;
}

expected<std::string> redis_client::command(const std::vector<std::string>& argv,
                                            std::string_view key) {
  if (opts_.cluster && slots_stale_)
    refresh_slots();
  node* n = key.empty() ? (nodes_.empty() ? nullptr : nodes_.front().get()) : node_for(key);
  if (!n)
    return make_error("unreachable", "no Redis node for the command");
  auto* c = connection(*n, 0);
  if (!c)
    return make_error("unreachable", last_error_);
  std::vector<const char*> a;
  std::vector<size_t> l;
  for (auto& s : argv) {
    a.push_back(s.data());
    l.push_back(s.size());
  }
  reply_ptr r{static_cast<redisReply*>(
    redisCommandArgv(c, static_cast<int>(a.size()), a.data(), l.data()))};
  if (!r) {
    fail_node(*n, "command: " + hiredis_error(c, opts_.timeout));
    return make_error("io", last_error_);
  }
  return flatten(r.get());
}

} // namespace kvs
