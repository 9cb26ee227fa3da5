// Walks every row of the LMCache op table (lmcache_wire/lmcache_ops.cpp)
// through every layer that reads it: decode (by name and by each id) ->
// request id / instance -> route and ack -> failure value -> gRPC method,
// request transcoder and response (where the row has one), and checks
// docs/ARCHITECTURE.md's "LMCache ops → files" table against the rows and
// the handler files. A row missing a piece, or an op missing a row, a doc
// line or a handler, fails here. (Named test_grpc_*: it links the gRPC
// transcoder, which links lmcache_wire.)
#include <doctest/doctest.h>

#include "lmcache_grpc/grpc_methods.hpp"
#include "lmcache_grpc/grpc_transcode.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "msgpack/msgpack_reader.hpp"
#include "msgpack/msgpack_writer.hpp"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace kvs;

namespace {

constexpr int64_t k_instance = 4242;
constexpr const char* k_request_id = "req-7";

template <class Fill>
std::string msgpack(Fill&& fill) {
  std::string out;
  msgpack_io::writer w(out);
  fill(w);
  w.finish();
  return out;
}

/// A valid 0.5.6 argument for each argument name the rows use. An argument
/// name not listed here fails the walk: a new op's arguments are added here.
std::map<std::string, std::string> sample_args() {
  std::map<std::string, std::string> a;
  a["key"] = msgpack([](msgpack_io::writer& w) {
    w.map(10);
    w.key("model_name");
    w.str("m");
    w.key("world_size");
    w.sint(1);
    w.key("worker_id");
    w.sint(0);
    w.key("token_ids");
    w.array(4);
    for (int t = 1; t <= 4; ++t)
      w.sint(t);
    w.key("start");
    w.sint(0);
    w.key("end");
    w.sint(4);
    w.key("request_id");
    w.str(k_request_id);
    w.key("cache_salt");
    w.str("");
    w.key("request_configs");
    w.nil();
    w.key("num_kv_readers");
    w.sint(1);
  });
  a["instance_id"] = msgpack([](msgpack_io::writer& w) { w.sint(k_instance); });
  a["kv_cache"] = msgpack([](msgpack_io::writer& w) { w.array(0); });
  a["model_name"] = msgpack([](msgpack_io::writer& w) { w.str("m"); });
  a["world_size"] = msgpack([](msgpack_io::writer& w) { w.sint(1); });
  a["engine_type"] = msgpack([](msgpack_io::writer& w) { w.str("vllm"); });
  a["layout_hints"] = msgpack([](msgpack_io::writer& w) { w.map(0); });
  a["engine_group_infos"] = msgpack([](msgpack_io::writer& w) { w.array(0); });
  a["block_ids"] = msgpack([](msgpack_io::writer& w) {
    w.array(1);
    w.array(1);
    w.sint(3);
  });
  a["event_ipc_handle"] = msgpack([](msgpack_io::writer& w) { w.bin(""); });
  a["skip_first_n_tokens"] = msgpack([](msgpack_io::writer& w) { w.sint(0); });
  a["tp_size"] = msgpack([](msgpack_io::writer& w) { w.sint(1); });
  a["request_id"] = msgpack([](msgpack_io::writer& w) { w.str(k_request_id); });
  a["timeout"] = msgpack([](msgpack_io::writer& w) { w.float64(1.5); });
  a["force"] = msgpack([](msgpack_io::writer& w) { w.boolean(true); });
  a["payload"] = msgpack([](msgpack_io::writer& w) {
    w.map(9);
    w.key("instance_id");
    w.sint(k_instance);
    w.key("model_name");
    w.str("m");
    w.key("world_size");
    w.sint(1);
    w.key("block_size");
    w.sint(16);
    w.key("num_layers");
    w.sint(2);
    w.key("hidden_dim_size");
    w.sint(64);
    w.key("dtype_str");
    w.str("bfloat16");
    w.key("use_mla");
    w.boolean(false);
    w.key("num_physical_slots");
    w.nil();
  });
  a["data"] = msgpack([](msgpack_io::writer& w) { w.bin(""); });
  a["records"] = msgpack([](msgpack_io::writer& w) { w.array(0); });
  a["required_chunk_alignment"] = msgpack([](msgpack_io::writer& w) { w.sint(16); });
  a["cursor"] = msgpack([](msgpack_io::writer& w) { w.sint(0); });
  a["max_events"] = msgpack([](msgpack_io::writer& w) { w.sint(64); });
  a["request"] = msgpack([](msgpack_io::writer& w) {
    w.map(2);
    w.key("method");
    w.str("x");
    w.key("payload");
    w.bin("");
  });
  return a;
}

expected<mp_request> decode_with(const std::string& op_frame, const std::vector<std::string>& args) {
  std::vector<std::string> frames{msgpack([](msgpack_io::writer& w) { w.sint(1); }), op_frame};
  frames.insert(frames.end(), args.begin(), args.end());
  std::vector<std::string_view> views(frames.begin(), frames.end());
  return decode_mp_request(views);
}

/// The request of `row` with its min_args sample arguments.
std::vector<std::string> args_of(const mp_op_row& row) {
  static const auto samples = sample_args();
  std::vector<std::string> args;
  for (size_t k = 0; k < row.min_args; ++k) {
    auto s = samples.find(row.arg_names[k]);
    INFO("op " << row.name << " argument '" << row.arg_names[k] << "'");
    REQUIRE_MESSAGE(s != samples.end(), "no sample for this argument: add one to sample_args()");
    args.push_back(s->second);
  }
  return args;
}

bool one_msgpack_value(const std::string& body) {
  msgpack_io::reader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  return r.skip(1) && r.remaining() == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string trim(std::string s) {
  auto b = s.find_first_not_of(' ');
  auto e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string{} : s.substr(b, e - b + 1);
}

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line.substr(1));
  std::string c;
  while (std::getline(s, c, '|'))
    out.push_back(trim(c));
  return out;
}

/// The backquoted pieces of a cell, in order.
std::vector<std::string> quoted(const std::string& cell) {
  std::vector<std::string> out;
  for (size_t i = cell.find('`'); i != std::string::npos; i = cell.find('`', i)) {
    auto j = cell.find('`', i + 1);
    if (j == std::string::npos)
      break;
    out.push_back(cell.substr(i + 1, j - i - 1));
    i = j + 1;
  }
  return out;
}

} // namespace

TEST_CASE("every op has exactly one row, found by its op, name and ids") {
  std::set<mp_op> seen;
  size_t n = 0;
  for (const auto& row : all_op_rows()) {
    INFO("op " << row.name);
    ++n;
    CHECK(seen.insert(row.op).second);
    CHECK(&op_row(row.op) == &row);
    CHECK(op_row_by_name(row.name) == &row);
    CHECK(std::string(to_string(row.op)) == row.name);
    CHECK(mp_op_from_name(row.name) == row.op);
    if (row.id >= 0) {
      CHECK(static_cast<int64_t>(row.op) == row.id); // the enum is numbered by the frozen ids
      CHECK(mp_op_from_id(row.id) == row.op);
      CHECK(op_row_by_id(row.id) == &row);
    } else {
      CHECK(static_cast<int>(row.op) >= 200); // name-only ops have no id value
    }
    if (row.id_pre_055 >= 0)
      CHECK(op_row_by_id(row.id_pre_055) == &row);
    CHECK(row.min_args <= row.max_args);
    CHECK(row.max_args <= 7);
    for (size_t k = 0; k < row.max_args; ++k)
      CHECK(std::string(row.arg_names[k] ? row.arg_names[k] : "") != "");
    // A request has a decoder; a stream (subscribe_kv_events) has none:
    // the engine bridge opens it (test_actor_op_handlers).
    const bool has_decoder = row.decode != nullptr;
    CHECK(has_decoder != row.streamed);
  }
  CHECK(n == 26);
}

TEST_CASE("every row decodes, by name and by each id, and answers request id, instance and route") {
  for (const auto& row : all_op_rows()) {
    INFO("op " << row.name);
    auto args = args_of(row);
    std::vector<std::string> op_frames{msgpack([&](msgpack_io::writer& w) { w.str(row.name); })};
    if (row.streamed) {
      // Not a request: refused by the request decoder, found by streamed_row.
      CHECK(row.id < 0);
      CHECK(streamed_row(op_frames.front()) == &row);
      auto req = decode_with(op_frames.front(), args);
      REQUIRE_FALSE(req.has_value());
      CHECK(req.error_value().kind == "unsupported_op");
      CHECK(req.error_value().detail.find(row.name) != std::string::npos);
      continue;
    }
    CHECK(streamed_row(op_frames.front()) == nullptr);
    if (row.id >= 0)
      op_frames.push_back(msgpack([&](msgpack_io::writer& w) { w.uint(static_cast<uint64_t>(row.id)); }));
    if (row.id_pre_055 >= 0)
      op_frames.push_back(msgpack([&](msgpack_io::writer& w) { w.uint(static_cast<uint64_t>(row.id_pre_055)); }));
    for (const auto& op_frame : op_frames) {
      auto req = decode_with(op_frame, args);
      REQUIRE_MESSAGE(req.has_value(), (req ? "" : req.error_value().detail));
      CHECK(req->op == row.op);
      CHECK(req->op_frame == op_frame);
      if (row.only_in != client_release::unknown)
        CHECK(req->release == row.only_in);
      // Request id: exactly the ops served by a session have one.
      const bool session_op = row.route == mp_route::new_session || row.route == mp_route::session ||
                              row.route == mp_route::end_session;
      const auto* rid = request_id_of(*req);
      CHECK((rid != nullptr) == session_op);
      if (rid)
        CHECK(*rid == k_request_id);
      // Instance: every op that binds or uses one names it.
      auto inst = instance_of(*req);
      if (row.instance_use != mp_instance_use::none)
        CHECK(inst == k_instance);
      if (row.instance)
        CHECK(inst == k_instance);
      else
        CHECK_FALSE(inst.has_value());
    }
    // One arity short (or long) is refused, naming the op.
    if (row.min_args > 0) {
      auto short_args = args;
      short_args.pop_back();
      auto bad = decode_with(op_frames.front(), short_args);
      REQUIRE_FALSE(bad.has_value());
      CHECK(bad.error_value().kind == "arity");
    }
  }
}

TEST_CASE("every row's route, ack and failure value agree with each other") {
  for (const auto& row : all_op_rows()) {
    INFO("op " << row.name);
    // Only the router acks, and only for an op it spawns a session for.
    if (row.ack == mp_ack::router)
      CHECK(row.route == mp_route::new_session);
    // Ops that copy on an instance's memory are a session's.
    if (row.instance_use == mp_instance_use::uses)
      CHECK(row.route == mp_route::new_session);
    if (row.instance_use == mp_instance_use::registers || row.instance_use == mp_instance_use::unregisters)
      CHECK(row.route == mp_route::registry);
    // Routes name their handler: store_clear is the store's on_clear, which
    // empties L1; no other op may reach it.
    CHECK((row.route == mp_route::store_clear) == (row.op == mp_op::clear));
    // An unknown-job answer only where a missing session is answered.
    if (row.unknown_job)
      CHECK(row.route == mp_route::session);
    auto failure = failure_body(row.op);
    CHECK(failure.has_value() == (row.failure != nullptr));
    if (failure)
      CHECK(one_msgpack_value(*failure));
    if (row.unknown_job)
      CHECK(one_msgpack_value(row.unknown_job()));
  }
  // LMCache's failure values, byte for byte.
  CHECK(*failure_body(mp_op::store) == std::string("\x92\xc4\x00\xc2", 4));
  CHECK(*failure_body(mp_op::commit_retrieve) == "\xc2");
  CHECK(op_row(mp_op::query_prefetch_status).unknown_job() == std::string(1, '\0'));
}

TEST_CASE("every row with a gRPC method has its paths, request transcoder and responses") {
  std::set<mp_op> with_method;
  for (const auto& m : all_grpc_methods()) {
    with_method.insert(m.op);
    INFO("path " << m.path);
    CHECK(op_row(m.op).grpc); // no method for an op the table says has none
    CHECK(m.subscribe == op_row(m.op).streamed); // a stream is a server-streaming RPC
  }
  for (const auto& row : all_op_rows()) {
    INFO("op " << row.name);
    CHECK(with_method.count(row.op) == (row.grpc ? 1u : 0u));
    if (!row.grpc)
      continue;
    for (const auto& m : all_grpc_methods()) {
      if (m.op != row.op)
        continue;
      INFO("path " << m.path);
      // The request transcoder exists (an empty message may still be refused
      // for a missing field, but never for want of a row).
      auto frames = grpc_request_frames(m, "", client_release::v0_5_6, 1);
      if (!frames)
        CHECK(frames.error_value().detail.find("no request transcoder") == std::string::npos);
      // The reply transcoder exists (a row, or the generic shapes): None
      // may be refused for want of a body, never for want of a transcoder.
      // (A stream's replies are KVEventBatch frames: grpc_kv_event_batch.)
      auto none = grpc_response(m, std::nullopt);
      if (!none && !row.streamed)
        CHECK(none.error_value().detail.find("no reply transcoder") == std::string::npos);
      // Every answer the table gives the op transcodes to its response.
      if (row.failure)
        CHECK(grpc_response(m, failure_body(row.op)).has_value());
      if (row.ack == mp_ack::router || row.route == mp_route::session)
        CHECK(grpc_response(m, std::nullopt).has_value());
      if (row.unknown_job)
        CHECK(grpc_response(m, row.unknown_job()).has_value());
    }
  }
}

TEST_CASE("docs/ARCHITECTURE.md's op table matches the rows and the handler files") {
  const std::string root = KVS_SOURCE_DIR;
  const auto doc = read_text(root + "/docs/ARCHITECTURE.md");
  auto at = doc.find("## LMCache ops → files");
  REQUIRE(at != std::string::npos);
  std::map<std::string, std::vector<std::string>> lines;
  std::stringstream s(doc.substr(at));
  std::string line;
  bool in_table = false;
  while (std::getline(s, line)) {
    if (line.rfind("| op |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table || line.rfind("| ---", 0) == 0)
      continue;
    if (line.rfind("| `", 0) != 0)
      break;
    auto c = cells(line);
    REQUIRE(c.size() == 7);
    auto name = quoted(c[0]);
    REQUIRE(name.size() == 1);
    CHECK_MESSAGE(lines.emplace(name[0], c).second, "op listed twice: " << name[0]);
  }
  CHECK(lines.size() == 26);
  for (const auto& row : all_op_rows()) {
    INFO("op " << row.name);
    auto l = lines.find(row.name);
    REQUIRE_MESSAGE(l != lines.end(), "no line in docs/ARCHITECTURE.md's op table");
    const auto& c = l->second;
    std::string id = row.id >= 0 ? std::to_string(row.id) : "name only";
    if (row.id_pre_055 >= 0)
      id += " (0.5.3/0.5.4: " + std::to_string(row.id_pre_055) + ")";
    CHECK(c[1] == id);
    CHECK(c[2] == to_string(row.route));
    CHECK(c[3] == to_string(row.ack));
    CHECK((c[4] == "—") == (row.failure == nullptr));
    CHECK(c[6] == (row.grpc ? "yes" : "no"));
    // Handler: `file` (`symbol`); ... — the file exists and names the symbol.
    auto q = quoted(c[5]);
    REQUIRE_FALSE(q.empty());
    std::string file;
    for (const auto& piece : q) {
      if (piece.find('/') != std::string::npos) {
        file = read_text(root + "/" + piece);
        INFO("file " << piece);
        CHECK_FALSE(file.empty());
      } else {
        INFO("symbol " << piece);
        CHECK(file.find(piece) != std::string::npos);
      }
    }
  }
}
