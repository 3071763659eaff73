#include "common/pipeline_spec.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "nlohmann/json.hpp"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using v1::JobSpec;
using v1::PipelineStage;
using v1::TrainingArguments;

bool IsStageKind(v1::JobKind kind) {
  return kind == v1::JOB_KIND_DISTILL || kind == v1::JOB_KIND_SFT || kind == v1::JOB_KIND_GRPO ||
         kind == v1::JOB_KIND_EVAL;
}

// sft, grpo and logit distillation leave checkpoints of a trained model in their output_dir.
bool TrainsModel(v1::JobKind kind, const TrainingArguments& t) {
  return kind == v1::JOB_KIND_SFT || kind == v1::JOB_KIND_GRPO ||
         (kind == v1::JOB_KIND_DISTILL && t.has_distill_loss());
}

// Trace distillation writes the traces it kept as a dataset, <output_dir>/dataset.
bool MakesDataset(v1::JobKind kind, const TrainingArguments& t) {
  return kind == v1::JOB_KIND_DISTILL && !t.has_distill_loss();
}

absl::Status CheckIndex(const JobSpec& pipeline, int index) {
  if (pipeline.kind() != v1::JOB_KIND_PIPELINE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", pipeline.name(), "' is ", JobKindName(pipeline.kind()), ", not a pipeline"));
  }
  if (index < 0 || index >= pipeline.stages_size()) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline '", pipeline.name(), "' has ",
                                                   pipeline.stages_size(), " stages, no stage ",
                                                   index));
  }
  return absl::OkStatus();
}

// A validation error of stage `index`'s standalone spec ("spec.training.x: ...") as an error of
// the pipeline: the stage's own fields under its path, the inherited ones under the job's.
std::string StageError(const JobSpec& pipeline, int index, const PipelineStageInputs& inputs,
                       absl::string_view line) {
  const size_t colon = line.find(": ");
  if (colon == absl::string_view::npos) return std::string(line);
  const absl::string_view field = line.substr(0, colon);
  absl::string_view message = line.substr(colon + 2);
  const std::string stage_path = absl::StrCat("spec.stages[", index, "]");
  auto under = [&](absl::string_view name) {
    return field == name || absl::StartsWith(field, absl::StrCat(name, ".")) ||
           absl::StartsWith(field, absl::StrCat(name, "["));
  };
  const absl::string_view rest = field.substr(std::string("spec").size());  // ".training.x"
  if (under("spec.model_name_or_path")) {
    if (message == "required") {
      return absl::StrCat(stage_path,
                          ".model_name_or_path: required (no earlier stage trains a model: sft, "
                          "grpo, distill with distill_loss; and spec.model_name_or_path is empty)");
    }
    return inputs.model_from >= 0 || !pipeline.stages(index).model_name_or_path().empty()
               ? absl::StrCat(stage_path, rest, ": ", message)
               : std::string(line);
  }
  if (under("spec.data_path")) {
    if (message == "required") {
      return absl::StrCat(stage_path,
                          ".data_path: required (the previous stage makes no dataset: only trace "
                          "distillation does; and spec.data_path is empty)");
    }
    return inputs.data_from >= 0 || !pipeline.stages(index).data_path().empty()
               ? absl::StrCat(stage_path, rest, ": ", message)
               : std::string(line);
  }
  if (under("spec.training") || under("spec.kind") || under("spec.name") ||
      (under("spec.output_dir") && !pipeline.stages(index).output_dir().empty())) {
    return absl::StrCat(stage_path, rest, ": ", message);
  }
  return std::string(line);
}

}  // namespace

std::string PipelineStageName(const JobSpec& pipeline, int index) {
  const PipelineStage& stage = pipeline.stages(index);
  return stage.name().empty() ? absl::StrCat(JobKindName(stage.kind()), "-", index) : stage.name();
}

std::string PipelineStageOutputDir(const JobSpec& pipeline, int index) {
  const PipelineStage& stage = pipeline.stages(index);
  if (!stage.output_dir().empty()) return stage.output_dir();
  if (pipeline.output_dir().empty()) return "";
  return absl::StrCat(pipeline.output_dir(), "/", PipelineStageName(pipeline, index));
}

TrainingArguments PipelineStageTraining(const JobSpec& pipeline, int index) {
  TrainingArguments merged = pipeline.training();
  const TrainingArguments& own = pipeline.stages(index).training();
  // MergeFrom appends repeated fields: a list the stage sets replaces the job's.
  if (own.reward_weights_size() > 0) merged.clear_reward_weights();
  merged.MergeFrom(own);
  return merged;
}

absl::StatusOr<PipelineStageInputs> ResolvePipelineStageInputs(const JobSpec& pipeline, int index) {
  if (absl::Status s = CheckIndex(pipeline, index); !s.ok()) return s;
  const PipelineStage& stage = pipeline.stages(index);
  PipelineStageInputs in;
  if (!stage.model_name_or_path().empty()) {
    in.model_name_or_path = stage.model_name_or_path();
  } else {
    for (int j = index - 1; j >= 0 && in.model_from < 0; --j) {
      if (TrainsModel(pipeline.stages(j).kind(), PipelineStageTraining(pipeline, j))) {
        in.model_name_or_path = PipelineStageOutputDir(pipeline, j);
        in.model_from = j;
      }
    }
    if (in.model_from < 0) in.model_name_or_path = pipeline.model_name_or_path();
  }
  in.base_model = in.model_name_or_path;
  if (in.model_from >= 0) {
    absl::StatusOr<PipelineStageInputs> from = ResolvePipelineStageInputs(pipeline, in.model_from);
    if (from.ok()) in.base_model = from->base_model;
  }
  if (!stage.data_path().empty()) {
    in.data_path = stage.data_path();
  } else if (index > 0 &&
             MakesDataset(pipeline.stages(index - 1).kind(),
                          PipelineStageTraining(pipeline, index - 1)) &&
             !PipelineStageOutputDir(pipeline, index - 1).empty()) {
    in.data_path = absl::StrCat(PipelineStageOutputDir(pipeline, index - 1), "/dataset");
    in.data_from = index - 1;
  } else {
    in.data_path = pipeline.data_path();
  }
  return in;
}

absl::StatusOr<JobSpec> PipelineStageSpec(const JobSpec& pipeline, int index) {
  absl::StatusOr<PipelineStageInputs> in = ResolvePipelineStageInputs(pipeline, index);
  if (!in.ok()) return in.status();
  const PipelineStage& stage = pipeline.stages(index);
  JobSpec spec;
  spec.set_name(absl::StrCat(pipeline.name(), "/", PipelineStageName(pipeline, index)));
  spec.set_kind(stage.kind());
  spec.set_model_name_or_path(in->model_name_or_path);
  spec.set_data_path(in->data_path);
  spec.set_deepspeed(pipeline.deepspeed());
  spec.set_deepspeed_config_json(pipeline.deepspeed_config_json());
  *spec.mutable_training() = PipelineStageTraining(pipeline, index);
  if (pipeline.has_resources()) *spec.mutable_resources() = pipeline.resources();
  spec.set_priority(pipeline.priority());
  if (pipeline.has_max_restarts()) spec.set_max_restarts(pipeline.max_restarts());
  *spec.mutable_env() = pipeline.env();
  *spec.mutable_labels() = pipeline.labels();
  *spec.mutable_node_selector() = pipeline.node_selector();
  spec.set_output_dir(PipelineStageOutputDir(pipeline, index));
  switch (stage.kind()) {
    case v1::JOB_KIND_GRPO:
      *spec.mutable_reward_funcs() = pipeline.reward_funcs();
      spec.set_reward_model_name_or_path(pipeline.reward_model_name_or_path());
      break;
    case v1::JOB_KIND_DISTILL:
      spec.set_teacher_model_name_or_path(pipeline.teacher_model_name_or_path());
      spec.set_teacher_endpoint(pipeline.teacher_endpoint());
      spec.set_teacher_endpoint_model(pipeline.teacher_endpoint_model());
      // Trace distillation verifies the teacher's answers with the rule rewards.
      if (!spec.training().has_distill_loss())
        *spec.mutable_reward_funcs() = pipeline.reward_funcs();
      break;
    case v1::JOB_KIND_EVAL:
      spec.set_reward_model_name_or_path(pipeline.reward_model_name_or_path());
      spec.set_baseline_model_name_or_path(pipeline.baseline_model_name_or_path());
      break;
    default:
      break;
  }
  ApplyJobSpecDefaults(&spec);
  return spec;
}

absl::StatusOr<std::string> PipelineStageDeepSpeedConfig(const std::string& resolved_per_stage,
                                                         const std::string& stage_name) {
  if (resolved_per_stage.empty()) return std::string();
  const nlohmann::json doc =
      nlohmann::json::parse(resolved_per_stage, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains(stage_name) || !doc[stage_name].is_object()) {
    return absl::DataLossError(absl::StrCat(
        "the pipeline's resolved DeepSpeed config has no object for stage '", stage_name, "'"));
  }
  return doc[stage_name].dump(2);
}

void CheckPipelineStages(const JobSpec& pipeline, std::vector<std::string>* errors) {
  auto add = [errors](std::string error) {
    if (std::find(errors->begin(), errors->end(), error) == errors->end()) {
      errors->push_back(std::move(error));
    }
  };
  std::set<std::string> names;
  bool has_eval = false;
  for (int i = 0; i < pipeline.stages_size(); ++i) {
    const PipelineStage& stage = pipeline.stages(i);
    const std::string path = absl::StrCat("spec.stages[", i, "]");
    const std::string name = PipelineStageName(pipeline, i);
    if (!names.insert(name).second) {
      add(absl::StrCat(path, ".name: duplicate stage name '", name, "'"));
    }
    if (!IsStageKind(stage.kind())) {
      add(absl::StrCat(path, ".kind: required, one of distill|sft|grpo|eval"));
      continue;
    }
    has_eval = has_eval || stage.kind() == v1::JOB_KIND_EVAL;
    absl::StatusOr<PipelineStageInputs> inputs = ResolvePipelineStageInputs(pipeline, i);
    absl::StatusOr<JobSpec> spec = PipelineStageSpec(pipeline, i);
    if (!inputs.ok() || !spec.ok()) continue;  // not a pipeline: reported at the job level
    // The job's DeepSpeed config is resolved per stage by ValidateJobSpec itself.
    spec->clear_deepspeed();
    spec->clear_deepspeed_config_json();
    absl::StatusOr<ValidatedJobSpec> validated = ValidateJobSpec(*spec);
    if (validated.ok()) continue;
    for (absl::string_view line : absl::StrSplit(validated.status().message(), '\n')) {
      add(StageError(pipeline, i, *inputs, line));
    }
  }
  if (!pipeline.baseline_model_name_or_path().empty() && !has_eval) {
    add("spec.baseline_model_name_or_path: only an eval job or stage measures a baseline; this "
        "pipeline has no eval stage");
  }
}

}  // namespace trainctl
