// What a job's ranks run at its current attempt: the one place the coordinator decides it, so that
// the gang runner (coordinator/gang_runner.h) only places and launches. The ranks take it as it
// is (worker/trainer/trainer_main.cc RunFromLaunch): defaults applied here, nothing left to check.
// A job's spec as stored (its defaults applied and its DeepSpeed config resolved at submit) with,
// on top, the settings of the remedies recorded for it (coordinator/remedy_ladder.h), or for a
// pipeline its current stage's spec and config (common/pipeline_spec.h): workers and trainers then
// see an ordinary job.
#ifndef TRAINCTL_COORDINATOR_JOB_LAUNCH_H_
#define TRAINCTL_COORDINATOR_JOB_LAUNCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

struct JobLaunch {
  trainctl::v1::JobSpec spec;             // validated, defaults and remedies applied
  std::string resolved_deepspeed_config;  // JSON, every "auto" the coordinator can fill filled
};

// FAILED_PRECONDITION when the remedies' settings make the spec invalid (naming why); the errors
// of common/pipeline_spec.h for a stage that cannot be built.
absl::StatusOr<JobLaunch> ResolveJobLaunch(const trainctl::v1::Job& job);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_LAUNCH_H_
