// The stages of pipeline jobs as they run (Job.stages, Job.current_stage): edits of a Job that
// JobManager makes inside its store transactions, so a stage's record changes atomically with the
// job's state and events. Other kinds of job have no stages; every function leaves them alone.
#ifndef TRAINCTL_COORDINATOR_JOB_STAGES_H_
#define TRAINCTL_COORDINATOR_JOB_STAGES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/timestamp.pb.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// At most this many metrics are kept as a stage's figures (the first ones reported).
inline constexpr int kMaxStageFigures = 64;

// Fills job->stages from job->spec (a validated pipeline, defaults applied), every stage pending,
// with the output_dir, model and data it will use; current_stage 0. INVALID_ARGUMENT when the spec
// has no stages to run (common/pipeline_spec.h).
absl::Status InitStages(trainctl::v1::Job* job);

// The stage that runs now or next; nullptr for a job without stages.
trainctl::v1::StageStatus* CurrentStage(trainctl::v1::Job* job);
const trainctl::v1::StageStatus* CurrentStage(const trainctl::v1::Job& job);

// Whether a stage follows the current one.
bool HasNextStage(const trainctl::v1::Job& job);

// Keeps the current stage in step with the job's state, which just became `to`: the stage starts
// when first placed (running, start time), counts the restarts of its attempts, and ends with the
// job (succeeded, failed, cancelled). Appends a stage_change event when the stage starts or ends.
void OnJobStateChange(trainctl::v1::Job* job, trainctl::v1::JobState to, const std::string& reason,
                      const google::protobuf::Timestamp& now,
                      std::vector<trainctl::v1::JobEvent>* events);

// Ends the current stage as succeeded and makes the next one current: the job's attempt, progress,
// last checkpoint and nodes start again for it. Appends the stage's stage_change event. The caller
// moves the job to pending. FAILED_PRECONDITION when no stage follows.
absl::Status AdvanceStage(trainctl::v1::Job* job, const std::string& reason,
                          const google::protobuf::Timestamp& now,
                          std::vector<trainctl::v1::JobEvent>* events);

// Keeps the sample's values as the current stage's figures (the last value of each metric).
void RecordStageFigures(trainctl::v1::Job* job, const trainctl::v1::MetricSample& sample);

// Names the current stage in each event that names none.
void TagEventsWithStage(const trainctl::v1::Job& job, std::vector<trainctl::v1::JobEvent>* events);

// "sft (2/4)" for messages; "" for a job without stages.
std::string CurrentStageLabel(const trainctl::v1::Job& job);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_STAGES_H_
