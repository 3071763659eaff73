#include "coordinator/job_launch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/pipeline_spec.h"
#include "common/status_macros.h"
#include "coordinator/remedy_ladder.h"

namespace trainctl {

namespace v1 = trainctl::v1;

absl::StatusOr<JobLaunch> ResolveJobLaunch(const v1::Job& job) {
  JobLaunch out;
  if (job.spec().kind() == v1::JOB_KIND_PIPELINE) {
    ASSIGN_OR_RETURN(out.spec, PipelineStageSpec(job.spec(), job.current_stage()));
    ASSIGN_OR_RETURN(
        out.resolved_deepspeed_config,
        PipelineStageDeepSpeedConfig(job.resolved_deepspeed_config_json(),
                                     PipelineStageName(job.spec(), job.current_stage())));
    return out;
  }
  if (job.remedies().empty()) {
    // Stored with its defaults at submit; applied again (it is idempotent) so that a job stored
    // by an older version gets the defaults of fields added since, which the ranks do not fill.
    out.spec = job.spec();
    ApplyJobSpecDefaults(&out.spec);
    out.resolved_deepspeed_config = job.resolved_deepspeed_config_json();
    return out;
  }
  // The remedies' settings on top of the spec, validated and resolved as at submit.
  ASSIGN_OR_RETURN(const v1::JobSpec remedied, ApplyRemedies(job.spec(), job.remedies()));
  absl::StatusOr<ValidatedJobSpec> validated = ValidateJobSpec(remedied);
  if (!validated.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the spec with its remedies is not valid: ", validated.status().message()));
  }
  out.spec = std::move(validated->spec);
  out.resolved_deepspeed_config = std::move(validated->resolved_deepspeed_config_json);
  return out;
}

}  // namespace trainctl
