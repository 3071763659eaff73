// An httplib::Server (Debian's cpp-httplib 0.11) that slow, idle or vanished peers cannot hold:
//
// - Each request must arrive whole (request line, headers and body) within request_read_timeout
//   of its first byte. cpp-httplib's own read timeout restarts with every byte, so a client
//   sending one header byte every few seconds kept a worker thread forever; here it is cut off.
// - Between keep-alive requests a connection waits at most idle_timeout for the next one.
// - Connections are served by a pool that starts a thread for each connection while fewer than
//   max_threads exist (more wait in the queue, each for at most the time above), so a few slow
//   sockets take a few threads and leave the rest to everyone else.
// - Shutdown() stops accepting and makes every connection end after the request it is answering:
//   waits for a next request or for a slow request's bytes stop at once.
// - A handler can ask whether its client has gone away (PeerClosed) and stop working for it.
//
// It replaces cpp-httplib's connection loop (process_and_close_socket) and socket stream with
// ones that poll with deadlines; request parsing, routing and responses stay cpp-httplib's
// (process_request).
#ifndef TRAINCTL_COMMON_HTTP_SERVER_H_
#define TRAINCTL_COMMON_HTTP_SERVER_H_

#include <httplib.h>

#include <atomic>
#include <cstddef>

#include "absl/time/time.h"

namespace trainctl::http {

struct ServerLimits {
  int max_threads = 64;  // connections served at once, >= 1
  absl::Duration request_read_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration write_timeout = absl::Seconds(10);  // for each write of a response
  int max_requests_per_connection = 100;
};

class BoundedServer : public httplib::Server {
 public:
  explicit BoundedServer(ServerLimits limits);

  // Stops accepting (httplib's stop()) and ends every connection once its current response is
  // written. Returns at once; listen_after_bind returns when the last connection has ended.
  void Shutdown();
  bool shutting_down() const { return stopping_.load(); }

  // On a handler's thread: whether the client of the request being handled has closed its end
  // (or reset the connection). False elsewhere.
  static bool PeerClosed();

  // After bind_to_port / bind_to_any_port: raises the listen backlog from cpp-httplib's 5, with
  // which a burst of connections (more than 5 before the accept loop wakes) lost their SYNs and
  // waited a second for the retransmission. False when it fails or nothing is bound.
  bool RaiseBacklog(int backlog = 1024);

  // Connections being served now (for tests and metrics).
  int active_connections() const { return active_.load(); }

 private:
  bool process_and_close_socket(socket_t sock) override;

  const ServerLimits limits_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};
};

}  // namespace trainctl::http

#endif  // TRAINCTL_COMMON_HTTP_SERVER_H_
