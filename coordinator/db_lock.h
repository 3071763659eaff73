// DbLock: one coordinator per database. Two coordinators writing one SQLite file would each
// schedule its jobs onto its own view of the workers; the second one to start is refused instead.
//
// The lock is an exclusive flock(2) on "<db>.lock", which the kernel releases when the holder's
// last descriptor closes, so it dies with its process (kill -9 included) and never needs cleaning
// up. The file records the holder's pid, host and address for the refusal message. Not copyable;
// thread-compatible.
#ifndef TRAINCTL_COORDINATOR_DB_LOCK_H_
#define TRAINCTL_COORDINATOR_DB_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainctl {

class DbLock {
 public:
  // Takes the lock for the database at `db_path` and records this process (pid, host) in the lock
  // file. FAILED_PRECONDITION naming the holder when another process holds it; UNAVAILABLE when
  // the lock file cannot be opened.
  static absl::StatusOr<std::unique_ptr<DbLock>> Acquire(const std::string& db_path);

  ~DbLock();  // releases the lock
  DbLock(const DbLock&) = delete;
  DbLock& operator=(const DbLock&) = delete;

  // Adds the address the holder serves on to the record (once it is bound).
  absl::Status SetAddress(const std::string& address);

  const std::string& path() const { return path_; }

 private:
  DbLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status WriteRecord(const std::string& address);

  const int fd_;
  const std::string path_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_DB_LOCK_H_
