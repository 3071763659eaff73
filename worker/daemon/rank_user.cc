#include "worker/daemon/rank_user.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainctl::worker {

absl::StatusOr<RankUser> LookUpRankUser(const std::string& name) {
  std::vector<char> buffer(1 << 16);
  passwd entry{};
  passwd* found = nullptr;
  int error = getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  uint32_t uid = 0;
  if (found == nullptr && error == 0 && absl::SimpleAtoi(name, &uid)) {
    error = getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found);
  }
  if (found == nullptr) {
    if (error != 0) {
      return absl::ErrnoToStatus(error, absl::StrCat("look up user '", name, "'"));
    }
    return absl::NotFoundError(absl::StrCat("no user '", name, "' in the user database"));
  }
  RankUser user;
  user.name = found->pw_name;
  user.uid = found->pw_uid;
  user.gid = found->pw_gid;
  user.home = found->pw_dir;
  int count = 64;
  user.groups.resize(count);
  while (getgrouplist(found->pw_name, found->pw_gid, user.groups.data(), &count) < 0) {
    user.groups.resize(count);  // `count` now says how many there are
  }
  user.groups.resize(count);
  return user;
}

absl::Status CheckCanRunAs(const RankUser& user) {
  const pid_t pid = fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    // Raw system calls, as the rank's child makes them (rank_child.cc).
    int error = 0;
    if (syscall(SYS_setgroups, user.groups.size(), user.groups.data()) != 0 ||
        syscall(SYS_setresgid, user.gid, user.gid, user.gid) != 0 ||
        syscall(SYS_setresuid, user.uid, user.uid, user.uid) != 0) {
      error = errno;
    }
    _exit(error > 0 && error < 256 ? error : (error == 0 ? 0 : 255));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::ErrnoToStatus(errno, "waitpid");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  const int error = WIFEXITED(status) ? WEXITSTATUS(status) : EPERM;
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat("cannot run ranks as user ", user.name, " (uid ", user.uid,
                                   ", gid ", user.gid, "): ", std::strerror(error),
                                   "; the worker needs to run as root, or with CAP_SETUID and "
                                   "CAP_SETGID, to switch its ranks to another user"));
}

absl::Status MakeRankOutputDir(const std::string& dir, const RankUser& user) {
  namespace fs = std::filesystem;
  std::vector<fs::path> missing;  // deepest first
  std::error_code ec;
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (mkdir(it->c_str(), 0755) != 0) {
      if (errno == EEXIST) continue;  // made meanwhile by someone else: theirs
      return absl::ErrnoToStatus(errno, absl::StrCat("create output directory ", it->string()));
    }
    if (chown(it->c_str(), user.uid, user.gid) != 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("hand output directory ", it->string(), " to user ", user.name));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainctl::worker
