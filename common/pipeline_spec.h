// Pipeline jobs: what each stage runs as. A stage of a pipeline runs as an ordinary job spec of its
// kind, resolved here by the rules in proto/trainctl/v1/job.proto (PipelineStage): the validator
// checks every stage's spec as a standalone job, and the coordinator launches it, so both see the
// same thing. Pure functions of the spec; nothing here reads files.
#ifndef TRAINCTL_COMMON_PIPELINE_SPEC_H_
#define TRAINCTL_COMMON_PIPELINE_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// Where a stage's model and data come from.
struct PipelineStageInputs {
  std::string model_name_or_path;  // empty: nothing names one
  int model_from = -1;             // the earlier stage whose output_dir it is; -1: the spec's
  std::string data_path;           // empty: nothing names one
  int data_from = -1;              // the earlier stage whose dataset it is; -1: the spec's
  // The model the chain of stages started from (an earlier stage's output has its architecture),
  // for what the control plane looks up by model name (the DeepSpeed hidden-size "auto"s).
  std::string base_model;
};

// The stage's name: its own, else "<kind>-<index>".
std::string PipelineStageName(const trainctl::v1::JobSpec& pipeline, int index);

// The stage's output_dir: its own, else "<job output_dir>/<stage name>" ("" when neither is set).
std::string PipelineStageOutputDir(const trainctl::v1::JobSpec& pipeline, int index);

// The stage's training arguments: the job's, with the ones the stage sets overriding them (a list
// the stage sets replaces the job's).
trainctl::v1::TrainingArguments PipelineStageTraining(const trainctl::v1::JobSpec& pipeline,
                                                      int index);

// The stage's model and data by the chaining rules. INVALID_ARGUMENT when `pipeline` is not a
// pipeline or `index` is not one of its stages.
absl::StatusOr<PipelineStageInputs> ResolvePipelineStageInputs(
    const trainctl::v1::JobSpec& pipeline, int index);

// The job spec stage `index` runs as, defaults applied (common/job_spec.h ApplyJobSpecDefaults):
// kind and inputs of the stage, the inherited fields, output_dir, name "<job name>/<stage name>".
// Its model_name_or_path or data_path is empty when nothing names one (the validator reports it).
// INVALID_ARGUMENT as ResolvePipelineStageInputs.
absl::StatusOr<trainctl::v1::JobSpec> PipelineStageSpec(const trainctl::v1::JobSpec& pipeline,
                                                        int index);

// The stage's DeepSpeed config from a pipeline's resolved config (a JSON object of stage name ->
// config, ValidatedJobSpec::resolved_deepspeed_config_json), as the ranks take it; "" when the
// pipeline has none. DATA_LOSS when the document does not have the stage.
absl::StatusOr<std::string> PipelineStageDeepSpeedConfig(const std::string& resolved_per_stage,
                                                         const std::string& stage_name);

// Validates every stage of a pipeline (defaults already applied) as a standalone job, appending
// "path: message" errors: a stage's own fields under "spec.stages[i]....", the job-level fields it
// inherits under their own path, each error once. The DeepSpeed config is not checked here
// (ValidateJobSpec resolves it per stage).
void CheckPipelineStages(const trainctl::v1::JobSpec& pipeline, std::vector<std::string>* errors);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_PIPELINE_SPEC_H_
