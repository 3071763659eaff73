// Distillation's part of the job spec: logit distillation's teacher_model_name_or_path and
// training arguments distill_loss, jsd_beta (TRL GKDConfig's beta), kd_temperature and kd_alpha;
// trace distillation's teacher (a checkpoint or an endpoint) and its knobs.
#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/job_spec_fixtures.h"

namespace trainctl {
namespace {

using spec_testing::ErrorLines;
using spec_testing::kMinimalSpec;
using spec_testing::ValidateYaml;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using trainctl::v1::TrainingArguments;

constexpr char kDistill[] = R"(
kind: distill
model_name_or_path: tiny
data_path: ./data
output_dir: ./out
)";

std::string Distill(const std::string& extra) { return std::string(kDistill) + extra + "\n"; }

TEST(DistillSpecTest, DefaultsAreTrlGkdsWithPureKd) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(Distill("teacher_model_name_or_path: ./teacher\ntraining: {distill_loss: jsd}"));
  ASSERT_TRUE(v.ok()) << v.status();
  const TrainingArguments& t = v->spec.training();
  EXPECT_EQ(v->spec.teacher_model_name_or_path(), "./teacher");
  EXPECT_EQ(t.distill_loss(), "jsd");
  ASSERT_TRUE(t.has_jsd_beta());
  EXPECT_DOUBLE_EQ(t.jsd_beta(), 0.5);
  ASSERT_TRUE(t.has_kd_temperature());
  EXPECT_DOUBLE_EQ(t.kd_temperature(), 1.0);
  ASSERT_TRUE(t.has_kd_alpha());
  EXPECT_DOUBLE_EQ(t.kd_alpha(), 1.0);
}

TEST(DistillSpecTest, DistillLossStaysUnsetForTraceDistillation) {
  // Unset distill_loss selects trace distillation; other kinds carry the numeric defaults.
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Distill("teacher_model_name_or_path: t"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->spec.training().has_distill_loss());
  v = ValidateYaml(kMinimalSpec);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->spec.training().has_distill_loss());
  EXPECT_DOUBLE_EQ(v->spec.training().jsd_beta(), 0.5);
}

TEST(DistillSpecTest, LogitDistillationNeedsATeacher) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(Distill("training: {distill_loss: forward_kl}"));
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.teacher_model_name_or_path: required for logit distillation "
                          "(distill_loss 'forward_kl')"));
}

TEST(DistillSpecTest, RangesAndChoicesNameTheField) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(
      Distill("teacher_model_name_or_path: t\ntraining: {distill_loss: kl, jsd_beta: 1.5, "
              "kd_temperature: 0, kd_alpha: -0.1}"));
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.distill_loss: must be one of forward_kl|reverse_kl|jsd, "
                          "got 'kl'",
                          "spec.training.jsd_beta: must be in [0, 1], got 1.5",
                          "spec.training.kd_temperature: must be > 0, got 0",
                          "spec.training.kd_alpha: must be in [0, 1], got -0.1"));
  // The ends of the ranges are allowed: beta 0 / 1 are forward / reverse KL, alpha 0 is SFT.
  v =
      ValidateYaml(Distill("teacher_model_name_or_path: t\ntraining: {distill_loss: jsd, "
                           "jsd_beta: 1, kd_temperature: 2.0, kd_alpha: 0}"));
  EXPECT_TRUE(v.ok()) << v.status();
}

TEST(DistillSpecTest, PipelineDistillStagesAreCheckedToo) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
model_name_or_path: tiny
data_path: ./data
output_dir: ./out
stages:
  - name: kd
    kind: distill
    training: {distill_loss: reverse_kl, kd_temperature: -1}
  - name: sft
    kind: sft
    training: {kd_temperature: -1}
)");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.stages[0].training.kd_temperature: must be > 0, got -1",
                          "spec.teacher_model_name_or_path: required for logit distillation "
                          "(distill_loss 'reverse_kl')"));
}

TEST(DistillSpecTest, TraceDistillationDefaults) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Distill("teacher_endpoint: http://t:8000/v1"));
  ASSERT_TRUE(v.ok()) << v.status();
  const TrainingArguments& t = v->spec.training();
  EXPECT_EQ(t.keep_per_prompt(), 1);
  EXPECT_EQ(t.teacher_concurrency(), 8);
  EXPECT_DOUBLE_EQ(t.teacher_timeout(), 600);
  EXPECT_EQ(t.teacher_max_retries(), 5);
  EXPECT_EQ(t.num_generations(), 8);
  EXPECT_DOUBLE_EQ(t.temperature(), 1.0);
  // open-r1's reasoning prompt, the format the format reward checks.
  EXPECT_THAT(t.distill_system_prompt(),
              HasSubstr("i.e., <think> reasoning process here </think><answer> answer here "
                        "</answer>"));
  EXPECT_EQ(t.distill_system_prompt().rfind("A conversation between User and Assistant.", 0), 0u);
}

TEST(DistillSpecTest, TraceDistillationNeedsExactlyOneTeacher) {
  const char* kWhy =
      "spec.teacher_model_name_or_path: trace distillation (no distill_loss) needs exactly one "
      "teacher: teacher_model_name_or_path (a checkpoint generating in process) or "
      "teacher_endpoint (an OpenAI-compatible server); ";
  EXPECT_THAT(ErrorLines(ValidateYaml(kDistill).status()),
              ElementsAre(std::string(kWhy) + "neither is set"));
  EXPECT_THAT(ErrorLines(ValidateYaml(Distill("teacher_model_name_or_path: t\n"
                                              "teacher_endpoint: http://t:8000/v1"))
                             .status()),
              ElementsAre(std::string(kWhy) + "both are set"));
  EXPECT_TRUE(ValidateYaml(Distill("teacher_model_name_or_path: t")).ok());
  EXPECT_TRUE(ValidateYaml(Distill("teacher_endpoint: https://t/v1")).ok());
}

TEST(DistillSpecTest, TeacherEndpointIsAnHttpUrlAndOnlyForTraces) {
  EXPECT_THAT(ErrorLines(ValidateYaml(Distill("teacher_endpoint: t:8000/v1")).status()),
              ElementsAre("spec.teacher_endpoint: must be an http:// or https:// URL, got "
                          "'t:8000/v1'"));
  EXPECT_THAT(
      ErrorLines(ValidateYaml(Distill("teacher_model_name_or_path: t\n"
                                      "teacher_endpoint: http://t/v1\n"
                                      "training: {distill_loss: jsd}"))
                     .status()),
      ElementsAre("spec.teacher_endpoint: logit distillation (distill_loss 'jsd') needs the "
                  "teacher's logits in process; an endpoint serves only trace distillation (no "
                  "distill_loss)"));
}

TEST(DistillSpecTest, TraceDistillationKnobsNameTheirFields) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(
      Distill("teacher_endpoint: http://t/v1\ntraining: {num_generations: 4, keep_per_prompt: 5, "
              "teacher_concurrency: 0, teacher_timeout: 0, teacher_max_retries: -1, "
              "max_completion_length: 0}"));
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.max_completion_length: must be >= 1, got 0",
                          "spec.training.keep_per_prompt: must be at most num_generations (4), "
                          "got 5",
                          "spec.training.teacher_concurrency: must be >= 1, got 0",
                          "spec.training.teacher_timeout: must be > 0, got 0",
                          "spec.training.teacher_max_retries: must be >= 0, got -1"));
  v = ValidateYaml(Distill("teacher_endpoint: http://t/v1\ntraining: {keep_per_prompt: 0}"));
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.keep_per_prompt: must be >= 1, got 0"));
  // A logit distillation job does not sample: these knobs are not its concern.
  EXPECT_TRUE(ValidateYaml(Distill("teacher_model_name_or_path: t\n"
                                   "training: {distill_loss: jsd, keep_per_prompt: 0}"))
                  .ok());
}

TEST(DistillSpecTest, PipelineTraceStagesNeedATeacher) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
model_name_or_path: tiny
data_path: ./data
output_dir: ./out
stages:
  - name: traces
    kind: distill
    training: {keep_per_prompt: 9}
  - name: sft
    kind: sft
)");
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre("spec.stages[0].training.keep_per_prompt: must be at most num_generations (8), "
                  "got 9",
                  HasSubstr("spec.teacher_model_name_or_path: trace distillation (no "
                            "distill_loss) needs exactly one teacher")));
}

}  // namespace
}  // namespace trainctl
