// Logit distillation's part of the job spec: teacher_model_name_or_path and the training
// arguments distill_loss, jsd_beta (TRL GKDConfig's beta), kd_temperature and kd_alpha.
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
  // Unset distill_loss selects trace distillation, which needs no teacher path here (the trainer
  // refuses it as unimplemented); other kinds carry the numeric defaults.
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kDistill);
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

}  // namespace
}  // namespace trainctl
