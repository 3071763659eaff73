// A stand-in for systemd's end of the notify protocol (sd_notify(3)): an AF_UNIX datagram socket
// that a daemon started with NOTIFY_SOCKET=<path()> sends its state to. Every assignment it
// receives ("READY=1", "STATUS=...", "WATCHDOG=1", "STOPPING=1") is recorded with its arrival
// time and the sender's pid (SO_PASSCRED, as systemd checks NotifyAccess=main).
#ifndef TRAINCTL_TESTS_TESTING_NOTIFY_SOCKET_H_
#define TRAINCTL_TESTS_TESTING_NOTIFY_SOCKET_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainctl::testing {

struct NotifyAssignment {
  std::string text;  // "WATCHDOG=1"
  pid_t sender = 0;
  absl::Time arrived;
};

class NotifySocket {
 public:
  // Binds a socket at `path` (which must not exist) and starts recording. INTERNAL on failure.
  static absl::StatusOr<std::unique_ptr<NotifySocket>> Bind(const std::string& path);
  ~NotifySocket();  // stops recording, removes the socket file
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  const std::string& path() const { return path_; }
  // Everything received so far, in arrival order. Thread-safe.
  std::vector<NotifyAssignment> Received() const;
  // The index in Received() of the first assignment at or after `from` that `match` accepts,
  // waiting up to `timeout` for it; -1 when none came.
  int WaitFor(const std::function<bool(const std::string&)>& match, absl::Duration timeout,
              size_t from = 0) const;
  // How many received assignments from index `from` on equal `text`.
  int Count(const std::string& text, size_t from = 0) const;
  // Everything received, one assignment per line, for failure messages.
  std::string Dump() const;

 private:
  NotifySocket(std::string path, int fd);
  void ReadLoop();

  const std::string path_;
  const int fd_;
  mutable absl::Mutex mu_;
  std::vector<NotifyAssignment> received_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_NOTIFY_SOCKET_H_
