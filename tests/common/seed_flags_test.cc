#include "common/seed_flags.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/job_spec_fixtures.h"
#include "tests/testing/seed.h"

namespace trainctl {
namespace {

using nlohmann::json;
using spec_testing::ErrorLines;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

constexpr char kSourceDir[] = TRAINCTL_SOURCE_DIR;
constexpr char kSeedDeepSpeed[] = TRAINCTL_SOURCE_DIR "/configs/ds_zero3_bf16.json";

using testing::ReadTextFile;
using testing::SeedLaunchFlags;

absl::StatusOr<FlagSpec> Parse(std::vector<std::string> args) {
  return JobSpecFromFlags(args, kSourceDir);
}

TEST(SeedFlagsTest, SeedLaunchLineGivesTheSeedsJob) {
  std::vector<std::string> args = {"--kind", "sft"};
  for (const std::string& arg : SeedLaunchFlags()) args.push_back(arg);
  absl::StatusOr<FlagSpec> parsed = Parse(args);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const JobSpec& spec = parsed->spec;

  EXPECT_EQ(spec.kind(), trainctl::v1::JOB_KIND_SFT);
  EXPECT_EQ(spec.model_name_or_path(), "Qwen/Qwen2-VL-7B-Instruct");
  EXPECT_EQ(spec.data_path(), "./data/processed_multimodal");
  EXPECT_EQ(spec.output_dir(), "./checkpoints/qwen2vl_r1");
  EXPECT_EQ(spec.deepspeed(), "./configs/ds_zero3_bf16.json");
  EXPECT_EQ(spec.deepspeed_config_json(), ReadTextFile(kSeedDeepSpeed));
  ASSERT_TRUE(spec.resources().has_slots_per_node());
  EXPECT_EQ(spec.resources().slots_per_node(), 8);
  EXPECT_FALSE(spec.resources().has_nodes());

  const auto& t = spec.training();
  EXPECT_EQ(t.per_device_train_batch_size(), 4);
  EXPECT_EQ(t.gradient_accumulation_steps(), 4);
  EXPECT_DOUBLE_EQ(t.learning_rate(), 2e-5);
  EXPECT_DOUBLE_EQ(t.num_train_epochs(), 3.0);
  EXPECT_TRUE(t.bf16());
  EXPECT_TRUE(t.tf32());
  EXPECT_DOUBLE_EQ(t.logging_steps(), 10.0);
  EXPECT_EQ(t.save_strategy(), "epoch");
  EXPECT_FALSE(t.has_fp16());  // only what the flags say; defaults come later

  ASSERT_EQ(parsed->warnings.size(), 1u);
  EXPECT_THAT(parsed->warnings[0], StartsWith("src/train_multimodal.py: "));
}

TEST(SeedFlagsTest, SeedJobValidatesToTheSeedsGlobalBatch) {
  std::vector<std::string> args = {"--kind", "sft"};
  for (const std::string& arg : SeedLaunchFlags()) args.push_back(arg);
  absl::StatusOr<FlagSpec> parsed = Parse(args);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(parsed->spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const json resolved = json::parse(v->resolved_deepspeed_config_json);
  EXPECT_EQ(resolved["train_batch_size"], 128);  // GLOBAL_BATCH
  EXPECT_EQ(resolved["zero_optimization"]["reduce_bucket_size"], 12845056);

  // The same job written as the example spec file is the same spec.
  absl::StatusOr<JobSpec> from_file =
      LoadJobSpecFile(std::string(kSourceDir) + "/configs/examples/sft_qwen2vl_7b.yaml");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  absl::StatusOr<ValidatedJobSpec> file_v = ValidateJobSpec(*from_file);
  ASSERT_TRUE(file_v.ok()) << file_v.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(v->spec.training(),
                                                                 file_v->spec.training()));
  EXPECT_EQ(v->resolved_deepspeed_config_json, file_v->resolved_deepspeed_config_json);
}

TEST(SeedFlagsTest, EqualsSyntaxAndSeparateValueAgree) {
  absl::StatusOr<FlagSpec> separate = Parse({"--learning_rate", "1e-4", "--num_gpus", "4"});
  absl::StatusOr<FlagSpec> joined = Parse({"--learning_rate=1e-4", "--num_gpus=4"});
  ASSERT_TRUE(separate.ok()) << separate.status();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(separate->spec, joined->spec));
  EXPECT_DOUBLE_EQ(joined->spec.training().learning_rate(), 1e-4);
  EXPECT_EQ(joined->spec.resources().slots_per_node(), 4);
}

TEST(SeedFlagsTest, HfBooleanSyntax) {
  struct Case {
    std::vector<std::string> args;
    bool bf16;
  };
  const Case cases[] = {
      {{"--bf16", "True"}, true},
      {{"--bf16", "true"}, true},
      {{"--bf16=true"}, true},
      {{"--bf16=false"}, false},
      {{"--bf16", "False"}, false},
      {{"--bf16", "yes"}, true},
      {{"--bf16", "no"}, false},
      {{"--bf16", "1"}, true},
      {{"--bf16", "0"}, false},
      {{"--bf16", "Y"}, true},
      {{"--bf16", "f"}, false},
      {{"--bf16"}, true},
      {{"--bf16", "--tf32", "True"}, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    absl::StatusOr<FlagSpec> parsed = Parse(c.args);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ASSERT_TRUE(parsed->spec.training().has_bf16());
    EXPECT_EQ(parsed->spec.training().bf16(), c.bf16);
  }
}

TEST(SeedFlagsTest, BareBoolFlagBeforeAnotherFlag) {
  absl::StatusOr<FlagSpec> parsed = Parse({"--bf16", "--gradient_checkpointing", "--tf32=False"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->spec.training().bf16());
  EXPECT_TRUE(parsed->spec.training().gradient_checkpointing());
  ASSERT_TRUE(parsed->spec.training().has_tf32());
  EXPECT_FALSE(parsed->spec.training().tf32());
}

TEST(SeedFlagsTest, BadValuesNameTheFlag) {
  EXPECT_THAT(ErrorLines(Parse({"--learning_rate", "fast"}).status()),
              ElementsAre(StartsWith("--learning_rate: must be a number")));
  EXPECT_THAT(ErrorLines(Parse({"--per_device_train_batch_size", "4.5"}).status()),
              ElementsAre("--per_device_train_batch_size: must be an integer, got 4.5"));
  EXPECT_THAT(ErrorLines(Parse({"--num_gpus=eight"}).status()),
              ElementsAre(StartsWith("--num_gpus: must be an integer")));
  EXPECT_THAT(ErrorLines(Parse({"--bf16", "maybe"}).status()),
              ElementsAre(AllOf(StartsWith("--bf16: "), HasSubstr("maybe"))));
  EXPECT_THAT(ErrorLines(Parse({"--kind", "dpo"}).status()),
              ElementsAre(StartsWith("--kind: must be one of distill|sft|grpo|eval|pipeline")));
  EXPECT_THAT(ErrorLines(Parse({"--learning_rate", "inf"}).status()),
              ElementsAre(StartsWith("--learning_rate: must be a number")));
}

TEST(SeedFlagsTest, InvalidUtf8IsAnErrorNotACrash) {
  EXPECT_THAT(ErrorLines(Parse({"--learning_rate", "\xff"}).status()),
              ElementsAre("--learning_rate: must be valid UTF-8 text"));
  EXPECT_THAT(ErrorLines(Parse({"--output_dir=./a\xc3"}).status()),
              ElementsAre("--output_dir: must be valid UTF-8 text"));
}

TEST(SeedFlagsTest, IntegerFlagsTakeIntegralFloats) {
  absl::StatusOr<FlagSpec> parsed = Parse({"--max_pixels", "1.2845056e7", "--max_steps", "-1"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.training().max_pixels(), 12845056);
  EXPECT_EQ(parsed->spec.training().max_steps(), -1);
}

TEST(SeedFlagsTest, MissingValueIsAnError) {
  EXPECT_THAT(ErrorLines(Parse({"--learning_rate"}).status()),
              ElementsAre("--learning_rate: needs a value"));
  EXPECT_THAT(ErrorLines(Parse({"--output_dir", "--bf16"}).status()),
              ElementsAre("--output_dir: needs a value"));
}

TEST(SeedFlagsTest, UnknownFlagSuggestsTheNearestFlag) {
  EXPECT_THAT(ErrorLines(Parse({"--lerning_rate", "1e-5"}).status()),
              ElementsAre("--lerning_rate: unknown flag (did you mean --learning_rate?)"));
  EXPECT_THAT(ErrorLines(Parse({"--learning-rate", "1e-5"}).status()),
              ElementsAre("--learning-rate: unknown flag (did you mean --learning_rate?)"));
  EXPECT_THAT(ErrorLines(Parse({"--num_gpu=8"}).status()),
              ElementsAre("--num_gpu: unknown flag (did you mean --num_gpus?)"));
  EXPECT_THAT(ErrorLines(Parse({"--zzzzzzzz", "1"}).status()),
              ElementsAre("--zzzzzzzz: unknown flag"));
}

TEST(SeedFlagsTest, EveryErrorIsReported) {
  // An unknown flag's value is skipped, not reported as a stray argument.
  absl::StatusOr<FlagSpec> parsed =
      Parse({"--lerning_rate", "1e-5", "--bf16", "maybe", "stray", "--seed", "x"});
  EXPECT_THAT(ErrorLines(parsed.status()),
              ElementsAre("--lerning_rate: unknown flag (did you mean --learning_rate?)",
                          StartsWith("--bf16: "), StartsWith("stray: unexpected argument"),
                          "--seed: must be an integer, got \"x\""));
}

TEST(SeedFlagsTest, EnvLabelAndNodeSelectorFlags) {
  absl::StatusOr<FlagSpec> parsed =
      Parse({"--env", "NCCL_DEBUG=INFO", "--env=NCCL_IB_DISABLE=0", "--env", "EMPTY=", "--label",
             "team=vlm", "--node_selector", "gpu=h100", "--env", "OPTS=a=b"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const JobSpec& spec = parsed->spec;
  ASSERT_EQ(spec.env().size(), 4u);
  EXPECT_EQ(spec.env().at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(spec.env().at("NCCL_IB_DISABLE"), "0");
  EXPECT_EQ(spec.env().at("EMPTY"), "");
  EXPECT_EQ(spec.env().at("OPTS"), "a=b");  // split at the first '='
  EXPECT_EQ(spec.labels().at("team"), "vlm");
  EXPECT_EQ(spec.node_selector().at("gpu"), "h100");
}

TEST(SeedFlagsTest, MalformedEnvIsAnError) {
  EXPECT_THAT(ErrorLines(Parse({"--env", "FOO"}).status()),
              ElementsAre("--env: must be KEY=VALUE, got 'FOO'"));
  EXPECT_THAT(ErrorLines(Parse({"--env", "=x"}).status()),
              ElementsAre("--env: must be KEY=VALUE, got '=x'"));
  EXPECT_THAT(ErrorLines(Parse({"--env"}).status()), ElementsAre("--env: needs a value"));
}

TEST(SeedFlagsTest, LauncherFlagsMapOntoResources) {
  absl::StatusOr<FlagSpec> parsed = Parse({"--nnodes", "2", "--num_gpus", "8"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.resources().nodes(), 2);
  EXPECT_EQ(parsed->spec.resources().slots_per_node(), 8);
  absl::StatusOr<FlagSpec> spelled = Parse({"--nodes=3", "--slots_per_node=2"});
  ASSERT_TRUE(spelled.ok()) << spelled.status();
  EXPECT_EQ(spelled->spec.resources().nodes(), 3);
  EXPECT_EQ(spelled->spec.resources().slots_per_node(), 2);
}

TEST(SeedFlagsTest, TrainctlTopLevelFlags) {
  absl::StatusOr<FlagSpec> parsed =
      Parse({"--kind", "grpo", "--name", "r1", "--priority", "7", "--max_restarts", "3"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.kind(), trainctl::v1::JOB_KIND_GRPO);
  EXPECT_EQ(parsed->spec.name(), "r1");
  EXPECT_EQ(parsed->spec.priority(), 7);
  EXPECT_EQ(parsed->spec.max_restarts(), 3);
  EXPECT_THAT(parsed->warnings, IsEmpty());
}

TEST(SeedFlagsTest, DeepSpeedPathIsReadRelativeToBaseDir) {
  absl::StatusOr<FlagSpec> missing =
      JobSpecFromFlags({"--deepspeed", "./configs/ds_zero3_bf16.json"}, "/nonexistent-dir");
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(StartsWith("spec.deepspeed: cannot read "),
                    HasSubstr("/nonexistent-dir/./configs/ds_zero3_bf16.json")));

  absl::StatusOr<FlagSpec> absolute = JobSpecFromFlags({"--deepspeed", kSeedDeepSpeed}, "/");
  ASSERT_TRUE(absolute.ok()) << absolute.status();
  EXPECT_EQ(absolute->spec.deepspeed_config_json(), ReadTextFile(kSeedDeepSpeed));
}

TEST(SeedFlagsTest, NonScriptPositionalIsAnError) {
  EXPECT_THAT(ErrorLines(Parse({"data.txt"}).status()),
              ElementsAre("data.txt: unexpected argument (flags are --name value)"));
}

TEST(SeedFlagsTest, IsSeedFlag) {
  for (const char* name :
       {"num_gpus",      "nnodes",       "nodes",      "slots_per_node", "model_name_or_path",
        "data_path",     "deepspeed",    "output_dir", "kind",           "name",
        "priority",      "max_restarts", "env",        "label",          "node_selector",
        "learning_rate", "bf16",         "tf32",       "save_strategy",  "num_generations",
        "beta"}) {
    EXPECT_TRUE(IsSeedFlag(name)) << name;
  }
  for (const char* name : {"", "lerning_rate", "labels", "stages", "training", "resources",
                           "deepspeed_config_json", "--bf16"}) {
    EXPECT_FALSE(IsSeedFlag(name)) << name;
  }
}

}  // namespace
}  // namespace trainctl
