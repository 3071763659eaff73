#include "coordinator/job_state.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "common/json_proto.h"

namespace trainctl {
namespace {

using trainctl::v1::JOB_STATE_CANCELLED;
using trainctl::v1::JOB_STATE_FAILED;
using trainctl::v1::JOB_STATE_PENDING;
using trainctl::v1::JOB_STATE_RESTARTING;
using trainctl::v1::JOB_STATE_RUNNING;
using trainctl::v1::JOB_STATE_SCHEDULED;
using trainctl::v1::JOB_STATE_SUCCEEDED;

bool In(JobState s, std::initializer_list<JobState> set) {
  for (JobState x : set) {
    if (x == s) return true;
  }
  return false;
}

}  // namespace

bool IsTerminal(JobState state) {
  return In(state, {JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED});
}

absl::Status CheckTransition(JobState from, JobState to) {
  bool legal = false;
  switch (from) {
    case JOB_STATE_PENDING:
      legal = In(to, {JOB_STATE_SCHEDULED, JOB_STATE_CANCELLED, JOB_STATE_FAILED});
      break;
    case JOB_STATE_SCHEDULED:
      // A failed launch may be retried (restarting) or give up (failed).
      legal =
          In(to, {JOB_STATE_RUNNING, JOB_STATE_RESTARTING, JOB_STATE_FAILED, JOB_STATE_CANCELLED});
      break;
    case JOB_STATE_RUNNING:
      // Pending again: a pipeline's next stage waits for its placement.
      legal = In(to, {JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED,
                      JOB_STATE_RESTARTING, JOB_STATE_PENDING});
      break;
    case JOB_STATE_RESTARTING:
      legal = In(to, {JOB_STATE_SCHEDULED, JOB_STATE_FAILED, JOB_STATE_CANCELLED});
      break;
    default:
      legal = false;  // terminal states and UNSPECIFIED
  }
  if (legal) return absl::OkStatus();
  if (IsTerminal(from)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job already ", JobStateName(from), "; cannot move to ", JobStateName(to)));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("illegal job state transition ", JobStateName(from), " -> ", JobStateName(to)));
}

std::string JobStateName(JobState state) {
  const auto* value = trainctl::v1::JobState_descriptor()->FindValueByNumber(state);
  return value == nullptr ? absl::StrCat("state(", static_cast<int>(state), ")")
                          : EnumShortName(value);
}

}  // namespace trainctl
