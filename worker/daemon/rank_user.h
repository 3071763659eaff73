// The worker's --rank_user: the user its ranks run as, so that job code and whatever a job's input
// makes the trainer do cannot read the daemon's own credentials (token file, TLS key). Looked up
// and tried once at start-up, so that a worker without the privilege to switch users says so then
// rather than failing every task.
#ifndef TRAINCTL_WORKER_DAEMON_RANK_USER_H_
#define TRAINCTL_WORKER_DAEMON_RANK_USER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/daemon/rank_launcher.h"

namespace trainctl::worker {

// `name` (a user name, or a numeric uid) from the user database: its uid, primary gid,
// supplementary groups and home directory. NOT_FOUND naming it when there is no such user.
absl::StatusOr<RankUser> LookUpRankUser(const std::string& name);

// Whether this process can become `user`: a forked child switches (groups, gid, uid) and exits.
// PERMISSION_DENIED saying what is needed (root, or CAP_SETUID and CAP_SETGID) when it cannot.
absl::Status CheckCanRunAs(const RankUser& user);

// Creates `dir` and its missing parents, handing each directory it creates to `user`, so that
// ranks running as `user` can write there. Directories that already exist are left as they are
// (their owner decides). The error names the directory.
absl::Status MakeRankOutputDir(const std::string& dir, const RankUser& user);

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_RANK_USER_H_
