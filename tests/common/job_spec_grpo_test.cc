// GRPO's part of the job spec: TRL GRPOConfig's knobs, reward_funcs and reward_weights.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/seed_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/job_spec_fixtures.h"

namespace trainctl {
namespace {

using spec_testing::ErrorLines;
using spec_testing::kMinimalSpec;
using spec_testing::ParseYaml;
using spec_testing::ValidateYaml;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using trainctl::v1::TrainingArguments;

constexpr char kGrpo[] = R"(
kind: grpo
model_name_or_path: Qwen/Qwen2-VL-2B-Instruct
data_path: ./prompts
output_dir: ./out
)";

std::string Grpo(const std::string& extra) { return std::string(kGrpo) + extra + "\n"; }

TEST(GrpoSpecTest, DefaultsAreTrlGrpoConfigs) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kGrpo);
  ASSERT_TRUE(v.ok()) << v.status();
  const TrainingArguments& t = v->spec.training();
  EXPECT_DOUBLE_EQ(t.beta(), 0.0);
  ASSERT_TRUE(t.has_temperature());
  EXPECT_DOUBLE_EQ(t.temperature(), 1.0);
  ASSERT_TRUE(t.has_top_p());
  EXPECT_DOUBLE_EQ(t.top_p(), 1.0);
  ASSERT_TRUE(t.has_top_k());
  EXPECT_EQ(t.top_k(), 0);
  EXPECT_DOUBLE_EQ(t.epsilon(), 0.2);
  ASSERT_TRUE(t.has_epsilon_high());
  EXPECT_DOUBLE_EQ(t.epsilon_high(), 0.2);
  EXPECT_EQ(t.loss_type(), "dapo");
  EXPECT_EQ(t.scale_rewards(), "group");
  EXPECT_EQ(t.num_iterations(), 1);
  EXPECT_EQ(t.importance_sampling_level(), "token");
  ASSERT_TRUE(t.has_mask_truncated_completions());
  EXPECT_FALSE(t.mask_truncated_completions());
  ASSERT_TRUE(t.has_gather_for_generation());
  EXPECT_TRUE(t.gather_for_generation());
  EXPECT_THAT(t.reward_weights(), IsEmpty());
  EXPECT_THAT(v->spec.reward_funcs(), ElementsAre("accuracy", "format"));
  EXPECT_EQ(v->spec.reward_model_name_or_path(), "");
}

TEST(GrpoSpecTest, EpsilonHighFollowsEpsilonUnlessSet) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Grpo("training: {epsilon: 0.1}"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_DOUBLE_EQ(v->spec.training().epsilon_high(), 0.1);
  v = ValidateYaml(Grpo("training: {epsilon: 0.2, epsilon_high: 0.28}"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_DOUBLE_EQ(v->spec.training().epsilon_high(), 0.28);
}

TEST(GrpoSpecTest, OtherKindsGetNoRewardFuncs) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kMinimalSpec);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->spec.reward_funcs(), IsEmpty());
  EXPECT_EQ(v->spec.training().loss_type(), "dapo");  // made explicit for every kind
}

TEST(GrpoSpecTest, RewardModelAloneGetsNoDefaultRules) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(Grpo("reward_model_name_or_path: org/rm\ntraining: {reward_weights: [2]}"));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->spec.reward_funcs(), IsEmpty());
}

TEST(GrpoSpecTest, ScaleRewardsTakesTrlBooleans) {
  for (const auto& [written, stored] :
       std::vector<std::pair<std::string, std::string>>{{"true", "group"},
                                                        {"false", "none"},
                                                        {"True", "group"},
                                                        {"batch", "batch"},
                                                        {"none", "none"}}) {
    absl::StatusOr<ValidatedJobSpec> v =
        ValidateYaml(Grpo("training: {scale_rewards: " + written + "}"));
    ASSERT_TRUE(v.ok()) << written << ": " << v.status();
    EXPECT_EQ(v->spec.training().scale_rewards(), stored) << written;
  }
  absl::StatusOr<JobSpec> json = ParseJobSpec(
      R"({"kind": "grpo", "training": {"scale_rewards": false}})", SpecFormat::kJson, "j.json");
  ASSERT_TRUE(json.ok()) << json.status();
  ApplyJobSpecDefaults(&*json);
  EXPECT_EQ(json->training().scale_rewards(), "none");
}

TEST(GrpoSpecTest, UnknownRewardFuncListsTheKnownOnes) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(Grpo("reward_funcs: [accuracy, acuracy, format, format]"));
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.reward_funcs[1]: unknown reward function 'acuracy', known: "
                          "accuracy|format|iou",
                          "spec.reward_funcs[3]: duplicate reward function 'format'"));
}

TEST(GrpoSpecTest, RewardWeightsNeedOnePerReward) {
  EXPECT_TRUE(ValidateYaml(Grpo("training: {reward_weights: [1.0, 0.5]}")).ok());
  EXPECT_TRUE(ValidateYaml(Grpo("reward_funcs: [iou, format]\nreward_model_name_or_path: org/rm\n"
                                "training: {reward_weights: [1, 1, 0.5]}"))
                  .ok());
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Grpo("training: {reward_weights: [1.0]}"));
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.reward_weights: needs one weight per reward (2: "
                          "reward_funcs, then reward_model_name_or_path when set), got 1"));
  // A reward model alone: one reward, and no default rule rewards to weigh.
  v = ValidateYaml(Grpo("reward_model_name_or_path: org/rm\ntraining: {reward_weights: [1, 1]}"));
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre(HasSubstr("spec.training.reward_weights: needs one weight per reward (1")));
  // Only an API client can send a NaN.
  absl::StatusOr<JobSpec> nan = ParseYaml(Grpo("training: {reward_weights: [1, 2]}"));
  ASSERT_TRUE(nan.ok()) << nan.status();
  nan->mutable_training()->set_reward_weights(1, std::nan(""));
  EXPECT_THAT(ErrorLines(ValidateJobSpec(*nan).status()),
              ElementsAre("spec.training.reward_weights[1]: must be a finite number, got nan"));
}

TEST(GrpoSpecTest, RangesAndChoicesNameTheFieldAndTheAllowedValues) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(Grpo(
      "training: {temperature: -0.5, top_p: 0, top_k: -1, epsilon: 0, epsilon_high: -1, "
      "loss_type: ppo, scale_rewards: std, num_iterations: 0, importance_sampling_level: seq}"));
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre(
          "spec.training.temperature: must be >= 0, got -0.5",
          "spec.training.top_p: must be in (0, 1], got 0",
          "spec.training.top_k: must be >= 0, got -1",
          "spec.training.epsilon: must be in (0, 1) (the lower clip bound is 1 - epsilon), got 0",
          "spec.training.epsilon_high: must be > 0, got -1",
          "spec.training.loss_type: must be one of grpo|bnpo|dr_grpo|dapo, got 'ppo'",
          "spec.training.scale_rewards: must be one of group|batch|none, got 'std'",
          "spec.training.num_iterations: must be >= 1, got 0",
          "spec.training.importance_sampling_level: must be one of "
          "token|sequence, got 'seq'"));
  EXPECT_FALSE(ValidateYaml(Grpo("training: {top_p: 1.01}")).ok());
  // Edges that are allowed: greedy sampling, top_p 1, top-k on.
  absl::StatusOr<ValidatedJobSpec> ok = ValidateYaml(
      Grpo("training: {temperature: 0, top_p: 1, top_k: 50, num_iterations: 4, loss_type: grpo, "
           "importance_sampling_level: sequence, mask_truncated_completions: true, "
           "gather_for_generation: false}"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FALSE(ok->spec.training().gather_for_generation());
}

TEST(GrpoSpecTest, OnlyGrpoJobsAreChecked) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(std::string(kMinimalSpec) +
                                                    "reward_funcs: [nope]\n"
                                                    "training: {loss_type: ppo, top_p: 0}\n");
  EXPECT_TRUE(v.ok()) << v.status();
}

constexpr char kGrpoPipeline[] = R"(
kind: pipeline
model_name_or_path: Qwen/Qwen2-VL-2B-Instruct
data_path: ./data
output_dir: ./out
training: {epsilon: 0.3}
stages:
  - {kind: sft}
)";

TEST(GrpoSpecTest, PipelineGrpoStagesAreCheckedAndGetTheDefaults) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(
      std::string(kGrpoPipeline) +
      "  - {kind: grpo, training: {epsilon: 0.1, loss_type: x, reward_weights: [1, 2]}}\n"
      "  - {kind: grpo, training: {reward_weights: [1, 2, 3]}}\n");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.stages[1].training.loss_type: must be one of "
                          "grpo|bnpo|dr_grpo|dapo, got 'x'",
                          HasSubstr("spec.stages[2].training.reward_weights: needs one weight per "
                                    "reward (2")));

  v = ValidateYaml(std::string(kGrpoPipeline) +
                   "  - {kind: grpo, training: {reward_weights: [1, 2]}}\n" +
                   "  - {kind: grpo, training: {epsilon: 0.1}}\n");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->spec.reward_funcs(), ElementsAre("accuracy", "format"));
  EXPECT_THAT(v->spec.stages(1).training().reward_weights(), ElementsAre(1, 2));
  EXPECT_DOUBLE_EQ(v->spec.stages(1).training().epsilon_high(), 0.3);  // the job's epsilon
  EXPECT_DOUBLE_EQ(v->spec.stages(2).training().epsilon(), 0.1);
  EXPECT_DOUBLE_EQ(v->spec.stages(2).training().epsilon_high(), 0.1);  // the stage's own
  // A pipeline without a grpo stage gets no reward functions.
  absl::StatusOr<ValidatedJobSpec> sft_only = ValidateYaml(kGrpoPipeline);
  ASSERT_TRUE(sft_only.ok()) << sft_only.status();
  EXPECT_THAT(sft_only->spec.reward_funcs(), IsEmpty());
}

TEST(GrpoSpecTest, DefaultsAreIdempotentForStageLists) {
  absl::StatusOr<JobSpec> spec = ParseYaml(
      std::string(kGrpoPipeline) + "  - {kind: grpo, training: {scale_rewards: false}}\n" +
      "  - {kind: grpo, training: {reward_weights: [3, 4]}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyJobSpecDefaults(&*spec);
  JobSpec twice = *spec;
  ApplyJobSpecDefaults(&twice);
  EXPECT_EQ(twice.SerializeAsString(), spec->SerializeAsString());
  EXPECT_THAT(spec->stages(2).training().reward_weights(), ElementsAre(3, 4));
  EXPECT_EQ(spec->stages(1).training().scale_rewards(), "none");
}

TEST(GrpoSpecTest, SeedFlagsSetRewardsAndLists) {
  absl::StatusOr<FlagSpec> flags = JobSpecFromFlags(
      {"--kind", "grpo", "--reward_funcs", "accuracy", "iou", "--reward_weights", "1.0", "-0.5",
       "--reward_model_name_or_path", "org/rm", "--scale_rewards", "False", "--epsilon_high=0.28",
       "--gather_for_generation", "false", "--mask_truncated_completions"},
      "/");
  ASSERT_TRUE(flags.ok()) << flags.status();
  const JobSpec& spec = flags->spec;
  EXPECT_THAT(spec.reward_funcs(), ElementsAre("accuracy", "iou"));
  EXPECT_THAT(spec.training().reward_weights(), ElementsAre(1.0, -0.5));
  EXPECT_EQ(spec.reward_model_name_or_path(), "org/rm");
  EXPECT_DOUBLE_EQ(spec.training().epsilon_high(), 0.28);
  EXPECT_FALSE(spec.training().gather_for_generation());
  EXPECT_TRUE(spec.training().mask_truncated_completions());
  JobSpec defaulted = spec;
  ApplyJobSpecDefaults(&defaulted);
  EXPECT_EQ(defaulted.training().scale_rewards(), "none");

  // A list flag given twice keeps the last list, as HF's parser does; one needs a value.
  flags = JobSpecFromFlags({"--reward_funcs", "format", "--reward_funcs=iou"}, "/");
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_THAT(flags->spec.reward_funcs(), ElementsAre("iou"));
  EXPECT_THAT(ErrorLines(JobSpecFromFlags({"--reward_weights", "--bf16"}, "/").status()),
              ElementsAre("--reward_weights: needs at least one value"));
  EXPECT_THAT(ErrorLines(JobSpecFromFlags({"--reward_weights", "1", "heavy"}, "/").status()),
              ElementsAre(HasSubstr("--reward_weights: ")));
}

// GRPO: each prompt's group of completions must fill whole global batches.
TEST(ValidateJobSpecTest, GrpoNumGenerationsMustDivideTheGlobalBatch) {
  const std::string grpo = R"(
kind: grpo
model_name_or_path: Qwen/Qwen2-VL-2B-Instruct
data_path: ./prompts
output_dir: ./out
resources: {slots_per_node: 8}
)";
  // 8 ranks x 4 per device = 32 completions per step.
  EXPECT_TRUE(
      ValidateYaml(grpo + "training: {per_device_train_batch_size: 4, num_generations: 8}").ok());
  EXPECT_TRUE(
      ValidateYaml(grpo + "training: {per_device_train_batch_size: 4, num_generations: 32}").ok());
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(grpo + "training: {per_device_train_batch_size: 4, num_generations: 6}");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.num_generations: must divide the completions of one step "
                          "(world 8 x per_device_train_batch_size 4 x gradient_accumulation_steps "
                          "1 = 32), got 6"));
  absl::StatusOr<ValidatedJobSpec> one =
      ValidateYaml(grpo + "training: {per_device_train_batch_size: 4, num_generations: 1}");
  EXPECT_THAT(ErrorLines(one.status()),
              ElementsAre("spec.training.num_generations: must be >= 2, got 1"));
  // Accumulation counts: one step generates for all its micro-batches (TRL's
  // generation_batch_size = per device x processes x steps_per_generation).
  EXPECT_TRUE(ValidateYaml(grpo + "training: {per_device_train_batch_size: 1, "
                                  "gradient_accumulation_steps: 16, num_generations: 16}")
                  .ok());
  absl::StatusOr<ValidatedJobSpec> accum =
      ValidateYaml(grpo +
                   "training: {per_device_train_batch_size: 1, gradient_accumulation_steps: 2, "
                   "num_generations: 32}");
  EXPECT_THAT(ErrorLines(accum.status()),
              ElementsAre(HasSubstr("spec.training.num_generations: must divide the completions of "
                                    "one step (world 8 x per_device_train_batch_size 1 x "
                                    "gradient_accumulation_steps 2 = 16), got 32")));
  // The rule is GRPO's only.
  absl::StatusOr<ValidatedJobSpec> sft =
      ValidateYaml(std::string(kMinimalSpec) + "training: {num_generations: 7}\n");
  EXPECT_TRUE(sft.ok()) << sft.status();
}

TEST(ValidateJobSpecTest, MultiNodeWorldCountsEveryNode) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: grpo
model_name_or_path: m
data_path: d
output_dir: o
resources: {nodes: 2, slots_per_node: 3}
training: {per_device_train_batch_size: 1, num_generations: 4}
)");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.num_generations: must divide the completions of one step "
                          "(world 6 x per_device_train_batch_size 1 x gradient_accumulation_steps "
                          "1 = 6), got 4"));
}

// The lower clip bound is 1 - epsilon: epsilon >= 1 would clip ratios to zero or below.
TEST(GrpoSpecTest, EpsilonMustLeaveAPositiveLowerClipBound) {
  EXPECT_THAT(ErrorLines(ValidateYaml(Grpo("training: {epsilon: 1.5}")).status()),
              ElementsAre("spec.training.epsilon: must be in (0, 1) (the lower clip bound is "
                          "1 - epsilon), got 1.5"));
  EXPECT_THAT(ErrorLines(ValidateYaml(Grpo("training: {epsilon: 1, epsilon_high: 0.2}")).status()),
              ElementsAre(HasSubstr("spec.training.epsilon: must be in (0, 1)")));
  // epsilon_high bounds the ratio from above (1 + epsilon_high): any positive value is sound.
  absl::StatusOr<ValidatedJobSpec> ok =
      ValidateYaml(Grpo("training: {epsilon: 0.99, epsilon_high: 1.5}"));
  ASSERT_TRUE(ok.ok()) << ok.status();
}

// --- Pipelines -------------------------------------------------------------------------------

}  // namespace
}  // namespace trainctl
