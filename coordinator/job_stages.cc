#include "coordinator/job_stages.h"

#include "absl/strings/str_cat.h"
#include "common/pipeline_spec.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

bool StageEnded(v1::StageState state) {
  return state == v1::STAGE_STATE_SUCCEEDED || state == v1::STAGE_STATE_FAILED ||
         state == v1::STAGE_STATE_CANCELLED;
}

v1::JobEvent StageEvent(const v1::Job& job, const v1::StageStatus& stage, const std::string& reason,
                        const google::protobuf::Timestamp& now) {
  v1::JobEvent event;
  *event.mutable_time() = now;
  event.set_stage(stage.name());
  v1::StageChange* change = event.mutable_stage_change();
  change->set_index(job.current_stage());
  change->set_name(stage.name());
  change->set_state(stage.state());
  change->set_reason(reason);
  if (StageEnded(stage.state())) *change->mutable_figures() = stage.figures();
  return event;
}

void EndStage(v1::Job* job, v1::StageState state, const std::string& reason,
              const google::protobuf::Timestamp& now, std::vector<v1::JobEvent>* events) {
  v1::StageStatus* stage = CurrentStage(job);
  if (stage == nullptr || StageEnded(stage->state())) return;
  stage->set_state(state);
  *stage->mutable_end_time() = now;
  stage->set_message(reason);
  events->push_back(StageEvent(*job, *stage, reason, now));
}

}  // namespace

absl::Status InitStages(v1::Job* job) {
  const v1::JobSpec& spec = job->spec();
  if (spec.kind() != v1::JOB_KIND_PIPELINE) return absl::OkStatus();
  if (spec.stages_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline job ", job->id(), " has no stages"));
  }
  job->clear_stages();
  for (int i = 0; i < spec.stages_size(); ++i) {
    absl::StatusOr<PipelineStageInputs> inputs = ResolvePipelineStageInputs(spec, i);
    if (!inputs.ok()) return inputs.status();
    v1::StageStatus* stage = job->add_stages();
    stage->set_name(PipelineStageName(spec, i));
    stage->set_kind(spec.stages(i).kind());
    stage->set_state(v1::STAGE_STATE_PENDING);
    stage->set_output_dir(PipelineStageOutputDir(spec, i));
    stage->set_model_name_or_path(inputs->model_name_or_path);
    if (inputs->model_from >= 0) stage->set_model_from(PipelineStageName(spec, inputs->model_from));
    stage->set_data_path(inputs->data_path);
    if (inputs->data_from >= 0) stage->set_data_from(PipelineStageName(spec, inputs->data_from));
  }
  job->set_current_stage(0);
  return absl::OkStatus();
}

v1::StageStatus* CurrentStage(v1::Job* job) {
  const int i = job->current_stage();
  return i >= 0 && i < job->stages_size() ? job->mutable_stages(i) : nullptr;
}

const v1::StageStatus* CurrentStage(const v1::Job& job) {
  const int i = job.current_stage();
  return i >= 0 && i < job.stages_size() ? &job.stages(i) : nullptr;
}

bool HasNextStage(const v1::Job& job) {
  return CurrentStage(job) != nullptr && job.current_stage() + 1 < job.stages_size();
}

void OnJobStateChange(v1::Job* job, v1::JobState to, const std::string& reason,
                      const google::protobuf::Timestamp& now, std::vector<v1::JobEvent>* events) {
  v1::StageStatus* stage = CurrentStage(job);
  if (stage == nullptr) return;
  switch (to) {
    case v1::JOB_STATE_SCHEDULED:
      stage->set_restarts(job->attempt());
      if (stage->state() == v1::STAGE_STATE_PENDING) {
        stage->set_state(v1::STAGE_STATE_RUNNING);
        *stage->mutable_start_time() = now;
        events->push_back(StageEvent(*job, *stage, "started", now));
      }
      break;
    case v1::JOB_STATE_SUCCEEDED:
      EndStage(job, v1::STAGE_STATE_SUCCEEDED, reason, now, events);
      break;
    case v1::JOB_STATE_FAILED:
      EndStage(job, v1::STAGE_STATE_FAILED, reason, now, events);
      break;
    case v1::JOB_STATE_CANCELLED:
      EndStage(job, v1::STAGE_STATE_CANCELLED, reason, now, events);
      break;
    default:
      break;
  }
}

absl::Status AdvanceStage(v1::Job* job, const std::string& reason,
                          const google::protobuf::Timestamp& now,
                          std::vector<v1::JobEvent>* events) {
  if (!HasNextStage(*job)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job->id(), " has no stage after its current one"));
  }
  EndStage(job, v1::STAGE_STATE_SUCCEEDED, reason, now, events);
  job->set_current_stage(job->current_stage() + 1);
  job->set_attempt(0);
  job->clear_progress();
  job->clear_last_checkpoint();
  job->clear_nodes();
  return absl::OkStatus();
}

void RecordStageFigures(v1::Job* job, const v1::MetricSample& sample) {
  v1::StageStatus* stage = CurrentStage(job);
  if (stage == nullptr) return;
  auto* figures = stage->mutable_figures();
  for (const auto& [name, value] : sample.values()) {
    if (figures->size() >= kMaxStageFigures && !figures->count(name)) continue;
    (*figures)[name] = value;
  }
}

void TagEventsWithStage(const v1::Job& job, std::vector<v1::JobEvent>* events) {
  const v1::StageStatus* stage = CurrentStage(job);
  if (stage == nullptr) return;
  for (v1::JobEvent& event : *events) {
    if (event.stage().empty()) event.set_stage(stage->name());
  }
}

std::string CurrentStageLabel(const v1::Job& job) {
  const v1::StageStatus* stage = CurrentStage(job);
  if (stage == nullptr) return "";
  return absl::StrCat(stage->name(), " (", job.current_stage() + 1, "/", job.stages_size(), ")");
}

}  // namespace trainctl
