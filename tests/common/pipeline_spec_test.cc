// Pipeline stages as the jobs they run as (common/pipeline_spec.h): inheritance, the model and
// data chaining rules, output dirs, and the validator's per-stage errors.
#include "common/pipeline_spec.h"

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/job_spec_fixtures.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using namespace spec_testing;  // NOLINT(build/namespaces): the suites' shared fixtures

// distill (traces) -> sft -> eval -> grpo -> eval, the seed's recipe with an eval in between.
constexpr char kChain[] = R"(
name: r1
kind: pipeline
model_name_or_path: base
data_path: /data/prompts
output_dir: /out
teacher_model_name_or_path: teacher
reward_funcs: [accuracy]
baseline_model_name_or_path: base
priority: 3
max_restarts: 2
resources: {nodes: 1, slots_per_node: 2}
env: {NCCL_DEBUG: INFO}
labels: {team: vlm}
node_selector: {zone: a}
training: {learning_rate: 2e-5, per_device_train_batch_size: 4, seed: 7}
stages:
  - {name: traces, kind: distill}
  - {name: sft, kind: sft, training: {learning_rate: 1e-5}}
  - {name: check, kind: eval}
  - {name: rl, kind: grpo, output_dir: /elsewhere/rl, training: {num_generations: 4}}
  - {name: final, kind: eval, data_path: /data/test}
)";

JobSpec Validated(const std::string& yaml) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(yaml);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? v->spec : JobSpec();
}

JobSpec Stage(const JobSpec& pipeline, int index) {
  absl::StatusOr<JobSpec> spec = PipelineStageSpec(pipeline, index);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

TEST(PipelineStageSpecTest, StagesRunAsJobsOfTheirKindWithTheJobsSettings) {
  const JobSpec pipeline = Validated(kChain);
  const JobSpec sft = Stage(pipeline, 1);
  EXPECT_EQ(sft.name(), "r1/sft");
  EXPECT_EQ(sft.kind(), v1::JOB_KIND_SFT);
  EXPECT_EQ(sft.output_dir(), "/out/sft");
  EXPECT_DOUBLE_EQ(sft.training().learning_rate(), 1e-5);      // the stage's own
  EXPECT_EQ(sft.training().per_device_train_batch_size(), 4);  // the job's
  EXPECT_EQ(sft.training().seed(), 7);
  EXPECT_EQ(sft.priority(), 3);
  EXPECT_EQ(sft.max_restarts(), 2);
  EXPECT_EQ(sft.resources().slots_per_node(), 2);
  EXPECT_EQ(sft.env().at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(sft.labels().at("team"), "vlm");
  EXPECT_EQ(sft.node_selector().at("zone"), "a");
  EXPECT_THAT(sft.stages(), IsEmpty());
  // Kind-specific fields go only to the stages that use them.
  EXPECT_TRUE(sft.teacher_model_name_or_path().empty());
  EXPECT_THAT(sft.reward_funcs(), IsEmpty());
  EXPECT_TRUE(sft.baseline_model_name_or_path().empty());
  EXPECT_EQ(Stage(pipeline, 0).teacher_model_name_or_path(), "teacher");
  EXPECT_THAT(Stage(pipeline, 3).reward_funcs(), ElementsAre("accuracy"));
  EXPECT_EQ(Stage(pipeline, 4).baseline_model_name_or_path(), "base");
  EXPECT_EQ(Stage(pipeline, 3).output_dir(), "/elsewhere/rl");
  // Eval stages decode greedily unless told otherwise, as eval jobs do.
  EXPECT_EQ(Stage(pipeline, 2).training().temperature(), 0);
  EXPECT_EQ(Stage(pipeline, 3).training().num_generations(), 4);
}

TEST(PipelineStageSpecTest, ModelsAndDataChainThroughTheStages) {
  const JobSpec pipeline = Validated(kChain);
  struct Want {
    std::string model;
    int model_from;
    std::string data;
    int data_from;
  };
  const std::vector<Want> want = {
      {"base", -1, "/data/prompts", -1},       // the job's
      {"base", -1, "/out/traces/dataset", 0},  // trace distill trains no model
      {"/out/sft", 1, "/data/prompts", -1},    // sft's output; eval keeps the job's data
      {"/out/sft", 1, "/data/prompts", -1},    // eval in between trains nothing
      {"/elsewhere/rl", 3, "/data/test", -1},  // the stage's own data
  };
  for (int i = 0; i < pipeline.stages_size(); ++i) {
    SCOPED_TRACE(i);
    absl::StatusOr<PipelineStageInputs> in = ResolvePipelineStageInputs(pipeline, i);
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(in->model_name_or_path, want[i].model);
    EXPECT_EQ(in->model_from, want[i].model_from);
    EXPECT_EQ(in->data_path, want[i].data);
    EXPECT_EQ(in->data_from, want[i].data_from);
    EXPECT_EQ(in->base_model, "base");
    EXPECT_EQ(Stage(pipeline, i).model_name_or_path(), want[i].model);
    EXPECT_EQ(Stage(pipeline, i).data_path(), want[i].data);
  }
}

TEST(PipelineStageSpecTest, LogitDistillationTrainsTheModelTheNextStageTakes) {
  const JobSpec pipeline = Validated(R"(
kind: pipeline
model_name_or_path: student
data_path: /d
output_dir: /o
teacher_model_name_or_path: teacher
stages:
  - {name: kd, kind: distill, training: {distill_loss: jsd}}
  - {name: eval, kind: eval}
)");
  EXPECT_EQ(Stage(pipeline, 1).model_name_or_path(), "/o/kd");
  EXPECT_EQ(Stage(pipeline, 1).data_path(), "/d");  // logit distillation writes no dataset
  EXPECT_EQ(Stage(pipeline, 0).teacher_model_name_or_path(), "teacher");
}

TEST(PipelineStageSpecTest, OnlyStagesOfAPipeline) {
  const JobSpec pipeline = Validated(kChain);
  EXPECT_EQ(PipelineStageSpec(pipeline, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PipelineStageSpec(pipeline, -1).status().code(), absl::StatusCode::kInvalidArgument);
  JobSpec sft = Stage(pipeline, 1);
  EXPECT_THAT(std::string(PipelineStageSpec(sft, 0).status().message()),
              HasSubstr("not a pipeline"));
}

TEST(PipelineStageSpecTest, DeepSpeedConfigOfOneStage) {
  const std::string per_stage = R"({"sft": {"train_batch_size": 8}, "eval": {}})";
  absl::StatusOr<std::string> sft = PipelineStageDeepSpeedConfig(per_stage, "sft");
  ASSERT_TRUE(sft.ok()) << sft.status();
  EXPECT_EQ(nlohmann::json::parse(*sft)["train_batch_size"], 8);
  EXPECT_EQ(*PipelineStageDeepSpeedConfig("", "sft"), "");
  EXPECT_EQ(PipelineStageDeepSpeedConfig(per_stage, "grpo").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(PipelineValidationTest, EveryStageIsCheckedAsTheJobItRunsAs) {
  // A stage with nothing to take its model or data from, a grpo stage whose group does not divide
  // its batch, an eval stage sampling greedily many times, a logit distillation without a teacher.
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
output_dir: /o
stages:
  - {name: rl, kind: grpo, training: {num_generations: 3}}
  - {name: eval, kind: eval, training: {num_generations: 2}}
  - {name: kd, kind: distill, training: {distill_loss: jsd}}
)");
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre(
          "spec.stages[0].model_name_or_path: required (no earlier stage trains a model: sft, "
          "grpo, distill with distill_loss; and spec.model_name_or_path is empty)",
          "spec.stages[0].data_path: required (the previous stage makes no dataset: only trace "
          "distillation does; and spec.data_path is empty)",
          "spec.stages[0].training.num_generations: must divide the completions of one step "
          "(world 1 x per_device_train_batch_size 8 x gradient_accumulation_steps 1 = 8), got 3",
          "spec.stages[1].data_path: required (the previous stage makes no dataset: only trace "
          "distillation does; and spec.data_path is empty)",
          "spec.stages[1].training.num_generations: greedy decoding (temperature 0) gives one "
          "completion per prompt; set temperature > 0 to sample 2, got 2",
          "spec.stages[2].data_path: required (the previous stage makes no dataset: only trace "
          "distillation does; and spec.data_path is empty)",
          "spec.teacher_model_name_or_path: required for logit distillation (distill_loss 'jsd')"));
}

TEST(PipelineValidationTest, ABaselineNeedsAnEvalStage) {
  EXPECT_TRUE(ValidateYaml(R"(
kind: pipeline
model_name_or_path: m
data_path: d
output_dir: o
baseline_model_name_or_path: b
stages: [{kind: sft}, {kind: eval}]
)")
                  .ok());
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
model_name_or_path: m
data_path: d
output_dir: o
baseline_model_name_or_path: b
stages: [{kind: sft}]
)");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.baseline_model_name_or_path: only an eval job or stage measures a "
                          "baseline; this pipeline has no eval stage"));
}

TEST(PipelineValidationTest, JobLevelErrorsAreReportedOnce) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
model_name_or_path: m
data_path: d
output_dir: o
reward_funcs: [accuracy, nonsense]
stages: [{name: a, kind: grpo, training: {num_generations: 2}},
         {name: b, kind: grpo, training: {num_generations: 2}}]
)");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre(HasSubstr("spec.reward_funcs[1]: unknown reward function 'nonsense'")));
}

TEST(PipelineValidationTest, ChainedStagesResolveDeepSpeedAgainstTheBaseModel) {
  absl::StatusOr<JobSpec> spec = ParseYaml(R"(
kind: pipeline
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
data_path: d
output_dir: o
stages: [{name: sft, kind: sft}, {name: eval, kind: eval}]
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_deepspeed_config_json(R"({"zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto"}})");
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(*spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const nlohmann::json per_stage = nlohmann::json::parse(v->resolved_deepspeed_config_json);
  // The eval stage's model is the sft stage's output dir; its hidden size is the 7B's.
  EXPECT_EQ(per_stage["eval"]["zero_optimization"]["reduce_bucket_size"], 3584 * 3584);
}

}  // namespace
}  // namespace trainctl
