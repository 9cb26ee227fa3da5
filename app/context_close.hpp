// Ends the ZeroMQ contexts at exit, within a deadline.
//
// zmq_ctx_term waits until every socket is closed and every closed socket's
// linger has passed. libzmq 4.3.4 can wait longer than that, without end:
// seen in CI and locally (about 1 exit in 35 under ASan) with a PUB socket,
// closed with a 1 s linger after a subscriber at its high-water mark had
// gone away; every thread but the I/O one idle, the main one in
// zmq_ctx_term (libzmq #2586 is the same symptom). By then every bridge has
// closed its sockets and said so in the log, so the process must not wait
// on it past sidecar.shutdown_timeout.
#pragma once

#include <chrono>
#include <vector>

namespace zmq {
class context_t;
}

namespace kvs {

/// Closes (zmq_ctx_term) each context in order on a helper thread and waits
/// until `deadline`. True: all closed, the thread joined. False: the thread
/// still waits inside libzmq and still uses the contexts, so the caller
/// must end the process without destroying them (std::_Exit).
bool close_contexts_until(const std::vector<zmq::context_t*>& contexts,
                          std::chrono::steady_clock::time_point deadline);

} // namespace kvs
