// trainctl's exit codes, and how a verb that failed says so: every verb reports through Fail().
#ifndef TRAINCTL_CLI_EXIT_CODES_H_
#define TRAINCTL_CLI_EXIT_CODES_H_

#include <ostream>
#include <string_view>

#include "absl/status/status.h"

namespace trainctl::cli {

// 0 success; 1 the command failed (unreachable coordinator, invalid spec, unknown job, a watched
// job that did not succeed); 2 usage errors.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// Writes `status` to `err`, one "<who>: <line>" per line of its message (a spec's validation
// errors come one per line), and returns `code`.
int Fail(std::ostream& err, const absl::Status& status, int code = kExitFailed,
         std::string_view who = "trainctl");

// For verbs whose flags are checked where the work starts: INVALID_ARGUMENT is a usage error (2),
// anything else a failure (1).
int UsageOrFailed(const absl::Status& status);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_EXIT_CODES_H_
