// Eval's part of the job spec: greedy by default, sampling knobs checked, a baseline only for
// eval jobs.
#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/job_spec_fixtures.h"

namespace trainctl {
namespace {

using spec_testing::ErrorLines;
using spec_testing::ValidateYaml;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using trainctl::v1::TrainingArguments;

constexpr char kEval[] = R"(
kind: eval
model_name_or_path: ./checkpoints/grpo
data_path: ./eval-shards
output_dir: ./eval
)";

std::string Eval(const std::string& extra) { return std::string(kEval) + extra + "\n"; }

TEST(EvalSpecTest, DefaultsToGreedyWithOneCompletionPerPrompt) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kEval);
  ASSERT_TRUE(v.ok()) << v.status();
  const TrainingArguments& t = v->spec.training();
  EXPECT_DOUBLE_EQ(t.temperature(), 0.0);
  EXPECT_EQ(t.num_generations(), 1);
  EXPECT_EQ(t.max_completion_length(), 256);
  EXPECT_EQ(t.per_device_eval_batch_size(), 8);
  EXPECT_THAT(v->spec.reward_funcs(), IsEmpty());
  EXPECT_EQ(v->spec.baseline_model_name_or_path(), "");
  // Applying the defaults again changes nothing.
  absl::StatusOr<ValidatedJobSpec> again = ValidateJobSpec(v->spec);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec.SerializeAsString(), v->spec.SerializeAsString());
}

TEST(EvalSpecTest, SamplesWhenATemperatureIsGiven) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Eval(R"(
baseline_model_name_or_path: Qwen/Qwen2-VL-2B-Instruct
reward_model_name_or_path: ./rm
training: {temperature: 0.7, top_p: 0.9, top_k: 20, num_generations: 8})"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_DOUBLE_EQ(v->spec.training().temperature(), 0.7);
  EXPECT_EQ(v->spec.training().num_generations(), 8);
  EXPECT_EQ(v->spec.baseline_model_name_or_path(), "Qwen/Qwen2-VL-2B-Instruct");
}

TEST(EvalSpecTest, GreedyWithSeveralGenerationsIsRefused) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Eval("training: {num_generations: 4}"));
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre(HasSubstr("spec.training.num_generations: greedy decoding")));
}

TEST(EvalSpecTest, BadGenerationKnobsNameTheirFields) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Eval(R"(
training: {temperature: -1, top_p: 0, top_k: -2, num_generations: 0, max_completion_length: 0})"));
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.num_generations: must be >= 1, got 0",
                          "spec.training.max_completion_length: must be >= 1, got 0",
                          "spec.training.temperature: must be >= 0, got -1",
                          "spec.training.top_p: must be in (0, 1], got 0",
                          "spec.training.top_k: must be >= 0, got -2"));
}

TEST(EvalSpecTest, OnlyAnEvalJobHasABaseline) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: sft
model_name_or_path: m
data_path: d
output_dir: o
baseline_model_name_or_path: b
)");
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.baseline_model_name_or_path: only an eval job measures a "
                          "baseline; this job is sft"));
}

TEST(EvalSpecTest, AnEvalStageOfAPipelineIsGreedyWhileGrpoSamples) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
model_name_or_path: m
data_path: d
output_dir: o
resources: {slots_per_node: 8}
stages:
  - {name: rl, kind: grpo}
  - {name: score, kind: eval}
)");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_DOUBLE_EQ(v->spec.stages(0).training().temperature(), 1.0);
  EXPECT_EQ(v->spec.stages(0).training().num_generations(), 8);
  EXPECT_DOUBLE_EQ(v->spec.stages(1).training().temperature(), 0.0);
  EXPECT_EQ(v->spec.stages(1).training().num_generations(), 1);
}

}  // namespace
}  // namespace trainctl
