// The hot path of the Redis client on the wire: pipelined GET / SET / EXISTS
// requests written straight from the caller's memory, and their replies read
// with a bulk string landing directly in its destination string.
//
// Why not hiredis here (hiredis 0.14 still does connect, AUTH, CLUSTER SLOTS
// and command()): its encoder copies every argument twice (into a formatted
// command, then into the context's output buffer, which it memmoves after
// each partial write), and its reader copies every bulk twice (into the
// reader's buffer, then into a reply object; redisReplyObjectFunctions only
// sees the bulk once it has been assembled in that buffer). For chunk-sized
// values those copies were most of the client's CPU time (BENCHMARKS.md,
// "L2 tiers"). The replies of these commands are four RESP2 types (simple
// string, error, integer, bulk or nil), so the reader below is small and
// strict: anything else is a protocol error that names what was wrong.
#pragma once

#include "core/error.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct resp_reply {
  enum class kind { status, error, integer, bulk, nil };
  kind type = kind::nil;
  std::string text;      ///< status or error line, bulk payload
  long long integer = 0;
};

/// Reads replies from a blocking socket whose SO_RCVTIMEO bounds each wait
/// (hiredis's redisSetTimeout sets it). One reader may serve several
/// connections one after the other: a connection's replies must all be
/// consumed (buffered() == 0) before the next one is read, else clear().
class resp_reader {
public:
  /// `max_bulk`: a bulk length above it is a protocol error (a hostile or
  /// broken server cannot make us allocate it); `timeout` is only quoted in
  /// the timed-out message.
  resp_reader(size_t max_bulk, std::chrono::milliseconds timeout);

  /// The next reply on `fd`. On failure an error naming it: kind "closed",
  /// "timeout" or "io" for the socket ("server closed the connection after
  /// 3 of 1000 bytes of a bulk reply"), "protocol" for a reply that breaks
  /// RESP ("bulk length 99999 over the limit of ..."); the connection is
  /// then unusable and the buffer should be clear()ed.
  /// A bulk goes to *bulk_to when given (its memory is reused), else to
  /// out.text.
  status next(int fd, resp_reply& out, std::string* bulk_to = nullptr);

  size_t buffered() const { return end_ - begin_; }
  void clear() { begin_ = end_ = 0; }

private:
  status fill(int fd, const char* waiting_for);
  status line(int fd, std::string_view* out);
  status bulk(int fd, long long len, std::string& dst);
  error io_error(ssize_t n, const std::string& waiting_for) const;

  size_t max_bulk_;
  std::chrono::milliseconds timeout_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
};

/// One argument of a command; `tail`, when not empty, is sent right after
/// `head` in the same bulk string (a header and a payload that are not
/// adjacent in memory go out without being copied together).
struct resp_arg {
  resp_arg(std::string_view s) : head(s) {}
  resp_arg(const char* s) : head(s) {}
  resp_arg(const std::string& s) : head(s) {}
  resp_arg(std::string_view h, std::string_view t) : head(h), tail(t) {}
  std::string_view head, tail;
};

/// Encodes commands as RESP arrays of bulk strings and sends them with one
/// sendmsg() per 1024 pieces: headers and small arguments are copied into
/// one buffer, large arguments (values) are sent from the caller's memory,
/// which must stay valid until flush().
class resp_writer {
public:
  void command(std::initializer_list<resp_arg> argv);
  /// Writes everything queued (blocking; SO_SNDTIMEO bounds each wait) and
  /// clears the queue. Error kind "timeout" or "io" on failure (no SIGPIPE).
  status flush(int fd);
  void clear();
  bool empty() const { return pieces_.empty(); }

private:
  void copy(std::string_view s);
  void put(std::string_view s); ///< copied if small, else by reference

  struct piece {
    const char* ref; ///< nullptr: `off` into small_
    size_t off;
    size_t len;
  };
  std::string small_;
  std::vector<piece> pieces_;
};

} // namespace kvs
