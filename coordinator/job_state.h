// The job state machine. Every state change in the coordinator goes through CheckTransition.
//
//   pending ──▶ scheduled ──▶ running ──▶ succeeded
//      │            │            │  ╲──▶ failed
//      │            │            ├──▶ restarting ──▶ scheduled (next attempt)
//      │            │            ╰──▶ pending (a pipeline's next stage, attempt 0)
//      ╰────────────┴────────────┴──────▶ cancelled | failed
#ifndef TRAINCTL_COORDINATOR_JOB_STATE_H_
#define TRAINCTL_COORDINATOR_JOB_STATE_H_

#include <string>

#include "absl/status/status.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

using trainctl::v1::JobState;

// succeeded, failed and cancelled: nothing leaves them.
bool IsTerminal(JobState state);

// OK when `from -> to` is a legal transition, else FAILED_PRECONDITION naming both states.
absl::Status CheckTransition(JobState from, JobState to);

// "pending", "running", ...
std::string JobStateName(JobState state);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_STATE_H_
