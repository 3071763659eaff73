#include "coordinator/db_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace trainctl {
namespace {

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

// "pid 123 on host-a, serving 127.0.0.1:50051" from a record, or what is known of it.
std::string DescribeHolder(int fd) {
  char buffer[1024] = {};
  const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
  std::string pid = "?", host = "?", address;
  for (absl::string_view line : absl::StrSplit(absl::string_view(buffer, n > 0 ? n : 0), '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "pid") pid = std::string(kv.second);
    if (kv.first == "host") host = std::string(kv.second);
    if (kv.first == "address") address = std::string(kv.second);
  }
  return absl::StrCat("pid ", pid, " on ", host,
                      address.empty() ? ", starting" : absl::StrCat(", serving ", address));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DbLock>> DbLock::Acquire(const std::string& db_path) {
  const std::string path = db_path + ".lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string why =
        err == EWOULDBLOCK
            ? absl::StrCat("database ", db_path, " is in use by another trainctl-coordinator (",
                           DescribeHolder(fd), "; lock file ", path,
                           "); stop it first, or give this one another --db")
            : absl::StrCat("cannot lock ", path, ": ", std::strerror(err));
    close(fd);
    if (err != EWOULDBLOCK) return absl::UnavailableError(why);
    return absl::FailedPreconditionError(why);
  }
  std::unique_ptr<DbLock> lock(new DbLock(fd, path));
  // The record only explains a refusal: a disk too full to take it must not stop a start.
  (void)lock->WriteRecord("");
  return lock;
}

DbLock::~DbLock() { close(fd_); }

absl::Status DbLock::SetAddress(const std::string& address) { return WriteRecord(address); }

absl::Status DbLock::WriteRecord(const std::string& address) {
  std::string record = absl::StrCat("pid=", getpid(), "\nhost=", HostName(), "\n");
  if (!address.empty()) absl::StrAppend(&record, "address=", address, "\n");
  if (ftruncate(fd_, 0) != 0 ||
      pwrite(fd_, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size())) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace trainctl
