// A real PostgreSQL server for tests: Debian's postgresql package (scripts/setup.sh installs it),
// initdb'd into a fresh temporary directory and run as a child of the test process.
#ifndef TRAINCTL_TESTS_TESTING_POSTGRES_SERVER_H_
#define TRAINCTL_TESTS_TESTING_POSTGRES_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::testing {

// A real PostgreSQL server for one test process: initdb into a fresh temp directory, the
// postmaster run as a child on a free 127.0.0.1 port (no Unix socket), trust authentication for
// user "trainctl". As root (PostgreSQL refuses to run as root) initdb and the server run as
// nobody:nogroup. The server gets SIGQUIT (immediate shutdown) when the test process dies, so it
// never outlives a crashed test. Thread-safe.
class PostgresServer {
 public:
  // Starts one; the error names what failed: binaries not found, initdb's output, or the server's
  // log tail when it did not accept connections within 30 s.
  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start();
  // Stops the server (SIGQUIT, then SIGKILL to it and its backends if it is still there after
  // 10 s), waits for it and removes the directory. Does nothing in a forked child of the process
  // that started it.
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // A new empty database on it (CREATE DATABASE with a name unique to this process), as a libpq
  // URI: "postgresql://trainctl@127.0.0.1:PORT/NAME".
  absl::StatusOr<std::string> CreateDatabase();

  // SIGKILLs the postmaster and its backends, as a crash would, and waits until they are gone.
  // What was committed stays in the data directory (a process crash: the WAL is in the page cache).
  absl::Status Kill();
  // Starts the server again on the same port and data directory after Kill() (crash recovery) and
  // waits until it accepts connections.
  absl::Status Restart();

  int port() const { return port_; }
  // The directory with the data directory (data/) and the server's log (postgres.log).
  const std::string& dir() const { return dir_; }
  // The server's log so far (all runs).
  std::string Log() const;

 private:
  PostgresServer(std::string bin_dir, std::string dir, uid_t uid, gid_t gid);
  // Forks the postmaster on port_ and waits until it accepts connections (or exits, or 30 s pass).
  absl::Status Launch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SIGKILLs the postmaster and every backend, reaps it, waits for the backends to be gone.
  absl::Status KillLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string AdminUri() const;

  const std::string bin_dir_;
  const std::string dir_;
  const uid_t uid_;  // whom initdb and the server run as
  const gid_t gid_;
  const pid_t owner_pid_;  // the test process (a forked child does not stop the server)
  int port_ = 0;           // set once, in Start
  mutable absl::Mutex mu_;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = -1;  // the postmaster; -1 when not running
};

// One server shared by every test in the process, started on first use and stopped at process
// exit. After a failed start every call returns that start's error.
absl::StatusOr<PostgresServer*> SharedPostgres();

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_POSTGRES_SERVER_H_
