#include "common/job_spec.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/json_proto.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/job_spec_fixtures.h"
#include "tests/testing/seed.h"
#include "tests/testing/temp_dir.h"

namespace trainctl {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::IsSupersetOf;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;
using trainctl::v1::JobKind;
using namespace spec_testing;  // NOLINT(build/namespaces): the suites' shared fixtures

// --- Parsing ---------------------------------------------------------------------------------

TEST(ParseJobSpecTest, YamlFillsNestedMessagesAndMaps) {
  absl::StatusOr<JobSpec> spec = ParseYaml(kSeedYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();

  EXPECT_EQ(spec->name(), "seed");
  EXPECT_EQ(spec->kind(), trainctl::v1::JOB_KIND_SFT);
  EXPECT_EQ(spec->model_name_or_path(), "Qwen/Qwen2-VL-7B-Instruct");
  EXPECT_EQ(spec->data_path(), "./data/processed_multimodal");
  EXPECT_EQ(spec->output_dir(), "./checkpoints/qwen2vl_r1");
  EXPECT_EQ(spec->priority(), 5);
  ASSERT_TRUE(spec->has_max_restarts());
  EXPECT_EQ(spec->max_restarts(), 2);

  const auto& t = spec->training();
  EXPECT_EQ(t.per_device_train_batch_size(), 4);
  EXPECT_EQ(t.gradient_accumulation_steps(), 4);
  EXPECT_DOUBLE_EQ(t.learning_rate(), 2e-5);
  EXPECT_DOUBLE_EQ(t.num_train_epochs(), 3.0);
  EXPECT_TRUE(t.bf16());
  ASSERT_TRUE(t.has_tf32());
  EXPECT_TRUE(t.tf32());
  EXPECT_DOUBLE_EQ(t.logging_steps(), 10.0);
  EXPECT_EQ(t.save_strategy(), "epoch");
  // Parsing applies no defaults: unset optional fields stay unset.
  EXPECT_FALSE(t.has_fp16());
  EXPECT_FALSE(t.has_seed());
  EXPECT_FALSE(t.has_max_grad_norm());

  EXPECT_EQ(spec->resources().nodes(), 1);
  EXPECT_EQ(spec->resources().slots_per_node(), 8);

  ASSERT_EQ(spec->env().size(), 3u);
  EXPECT_EQ(spec->env().at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(spec->env().at("NCCL_IB_DISABLE"), "0");  // a YAML integer, kept as its text
  EXPECT_EQ(spec->env().at("NCCL_NET_GDR_LEVEL"), "2");
  ASSERT_EQ(spec->labels().size(), 1u);
  EXPECT_EQ(spec->labels().at("team"), "vlm");
  ASSERT_EQ(spec->node_selector().size(), 2u);
  EXPECT_EQ(spec->node_selector().at("gpu"), "h100");
  EXPECT_EQ(spec->node_selector().at("fabric"), "infiniband");
}

TEST(ParseJobSpecTest, InlineDeepSpeedMappingIsStoredAsJson) {
  absl::StatusOr<JobSpec> spec = ParseYaml(kSeedYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->deepspeed(), "");
  ASSERT_FALSE(spec->deepspeed_config_json().empty());
  const json ds = json::parse(spec->deepspeed_config_json());
  EXPECT_EQ(ds["zero_optimization"]["stage"], 3);
  EXPECT_EQ(ds["zero_optimization"]["sub_group_size"], 1e9);
  EXPECT_EQ(ds["zero_optimization"]["reduce_bucket_size"], "auto");
  EXPECT_EQ(ds["bf16"]["enabled"], true);
  EXPECT_EQ(ds["gradient_clipping"], 1.0);
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], "auto");
}

TEST(ParseJobSpecTest, DeepSpeedPathIsKeptAsAPath) {
  absl::StatusOr<JobSpec> spec = ParseYaml(std::string(kMinimalSpec) + "deepspeed: ./ds.json\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->deepspeed(), "./ds.json");
  EXPECT_EQ(spec->deepspeed_config_json(), "");
}

TEST(ParseJobSpecTest, JsonGivesTheSameSpecAsYaml) {
  absl::StatusOr<JobSpec> from_yaml = ParseYaml(kSeedYaml);
  absl::StatusOr<JobSpec> from_json = ParseJobSpec(kSeedJson, SpecFormat::kJson, "job.json");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(*from_yaml, *from_json)) << diff;
  // JSON is a subset of YAML: the JSON text read as YAML gives the same spec too.
  absl::StatusOr<JobSpec> json_as_yaml = ParseYaml(kSeedJson);
  ASSERT_TRUE(json_as_yaml.ok()) << json_as_yaml.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*from_yaml, *json_as_yaml));
}

TEST(ParseJobSpecTest, EnumTakesShortAndFullNamesInAnyCase) {
  for (const char* kind : {"sft", "SFT", "Sft", "JOB_KIND_SFT"}) {
    absl::StatusOr<JobSpec> spec = ParseYaml(absl::StrCat("kind: ", kind, "\n"));
    ASSERT_TRUE(spec.ok()) << kind << ": " << spec.status();
    EXPECT_EQ(spec->kind(), trainctl::v1::JOB_KIND_SFT) << kind;
  }
  absl::StatusOr<JobSpec> pipeline = ParseYaml("kind: pipeline\n");
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ(pipeline->kind(), trainctl::v1::JOB_KIND_PIPELINE);
}

TEST(ParseJobSpecTest, UnknownEnumValueListsTheChoices) {
  absl::StatusOr<JobSpec> spec = ParseYaml("kind: dpo\n");
  EXPECT_THAT(
      ErrorLines(spec.status()),
      ElementsAre("spec.kind: must be one of distill|sft|grpo|eval|pipeline|probe, got \"dpo\""));
}

TEST(ParseJobSpecTest, KubernetesStyleSpecWrapperIsAccepted) {
  absl::StatusOr<JobSpec> spec = ParseYaml("spec:\n  kind: grpo\n  output_dir: ./o\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind(), trainctl::v1::JOB_KIND_GRPO);
  EXPECT_EQ(spec->output_dir(), "./o");
}

TEST(ParseJobSpecTest, QuotedYamlScalarsStayStrings) {
  absl::StatusOr<JobSpec> spec = ParseYaml("env:\n  A: \"0\"\n  B: 'true'\n  C: true\n  D: 1.5\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->env().at("A"), "0");
  EXPECT_EQ(spec->env().at("B"), "true");
  EXPECT_EQ(spec->env().at("C"), "true");
  EXPECT_EQ(spec->env().at("D"), "1.5");
}

TEST(ParseJobSpecTest, IntegerFieldsTakeIntegralFloats) {
  absl::StatusOr<JobSpec> spec = ParseYaml("training:\n  max_pixels: 1.2845056e7\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training().max_pixels(), 12845056);
  absl::StatusOr<JobSpec> fractional = ParseYaml("training:\n  max_steps: 2.5\n");
  EXPECT_THAT(ErrorLines(fractional.status()),
              ElementsAre("spec.training.max_steps: must be an integer, got 2.5"));
}

TEST(ParseJobSpecTest, ExplicitNullLeavesTheFieldUnset) {
  absl::StatusOr<JobSpec> spec = ParseYaml("training:\n  learning_rate: ~\n  seed: null\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->training().has_learning_rate());
  EXPECT_FALSE(spec->training().has_seed());
}

TEST(ParseJobSpecTest, BoolFieldsTakeHfSpellings) {
  absl::StatusOr<JobSpec> spec = ParseYaml("training:\n  bf16: yes\n  fp16: 'False'\n  tf32: 1\n");
  // `yes` is a string in YAML 1.2; bool fields read it the HF way. A bare 1 is a number, not a
  // bool.
  EXPECT_THAT(ErrorLines(spec.status()),
              ElementsAre("spec.training.tf32: must be true or false, got 1"));
  absl::StatusOr<JobSpec> ok = ParseYaml("training:\n  bf16: yes\n  fp16: 'False'\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->training().bf16());
  ASSERT_TRUE(ok->training().has_fp16());
  EXPECT_FALSE(ok->training().fp16());
}

TEST(ParseJobSpecTest, PipelineStagesAreParsedInOrder) {
  absl::StatusOr<JobSpec> spec = ParseYaml(R"(
kind: pipeline
stages:
  - name: distill
    kind: distill
    model_name_or_path: teacher
  - {name: sft, kind: sft, training: {learning_rate: 1e-5}}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->stages_size(), 2);
  EXPECT_EQ(spec->stages(0).name(), "distill");
  EXPECT_EQ(spec->stages(0).kind(), trainctl::v1::JOB_KIND_DISTILL);
  EXPECT_EQ(spec->stages(0).model_name_or_path(), "teacher");
  EXPECT_EQ(spec->stages(1).kind(), trainctl::v1::JOB_KIND_SFT);
  EXPECT_DOUBLE_EQ(spec->stages(1).training().learning_rate(), 1e-5);
}

TEST(ParseJobSpecTest, YamlSyntaxErrorNamesFileAndLine) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec("kind: sft\ntraining:\n  learning_rate: [1, 2\n",
                                              SpecFormat::kYaml, "jobs/seed.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("jobs/seed.yaml:"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("invalid YAML"));
  EXPECT_THAT(Lines(spec.status().message()), SizeIs(1));

  absl::StatusOr<JobSpec> bad_indent =
      ParseJobSpec("kind: sft\ntraining:\n  seed: 1\n bf16: true\n", SpecFormat::kYaml, "x.yaml");
  ASSERT_EQ(bad_indent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_indent.status().message()), StartsWith("x.yaml:4:"));
}

TEST(ParseJobSpecTest, YamlDuplicateKeyIsAnError) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec("kind: sft\ntraining:\n  seed: 1\n  seed: 2\n", SpecFormat::kYaml, "d.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("d.yaml:4:"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("duplicate key 'seed'"));
}

TEST(ParseJobSpecTest, JsonSyntaxErrorNamesFileAndLine) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec("{\n  \"kind\": \"sft\",\n  \"training\": {,}\n}\n",
                                              SpecFormat::kJson, "jobs/seed.json");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith("jobs/seed.json:3:16: invalid JSON: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("syntax error"));

  absl::StatusOr<JobSpec> truncated =
      ParseJobSpec("{\n  \"kind\": \"sft\"\n", SpecFormat::kJson, "t.json");
  ASSERT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(truncated.status().message()), StartsWith("t.json:"));
}

// A number no double holds is not a syntax error to the JSON parser (it throws out_of_range):
// found by job_spec_fuzz (tests/fuzz/regressions/job_spec_fuzz), once an uncaught exception.
TEST(ParseJobSpecTest, JsonNumberOverflowIsAnErrorQuotingTheNumber) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec("{\"kind\": \"sft\", \"training\": {\"learning_rate\": -2e999}}",
                   SpecFormat::kJson, "big.json");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("big.json: invalid JSON: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("number overflow parsing '-2e999'"));
  // YAML reads it as infinity, which the message names as such (JSON would write null).
  absl::StatusOr<JobSpec> yaml = ParseJobSpec("kind: sft\ntraining:\n  learning_rate: -1e999\n",
                                              SpecFormat::kYaml, "big.yaml");
  ASSERT_FALSE(yaml.ok());
  EXPECT_THAT(std::string(yaml.status().message()),
              HasSubstr("learning_rate: must be finite, got -infinity"));
}

// Stray bytes are reported where they are, never thrown out of the parser.
TEST(ParseJobSpecTest, InvalidUtf8IsAnErrorNamingFileAndLine) {
  absl::StatusOr<JobSpec> value =
      ParseJobSpec("kind: sft\nenv:\n  A: \"a\xff\"\n", SpecFormat::kYaml, "u.yaml");
  EXPECT_THAT(ErrorLines(value.status()), ElementsAre("u.yaml:3:6: invalid YAML: invalid UTF-8"));
  // A mistyped value would otherwise be quoted in the error message.
  absl::StatusOr<JobSpec> typed =
      ParseJobSpec("resources:\n  nodes: \"\xc3\x28\"\n", SpecFormat::kYaml, "u.yaml");
  EXPECT_THAT(ErrorLines(typed.status()), ElementsAre("u.yaml:2:10: invalid YAML: invalid UTF-8"));
  absl::StatusOr<JobSpec> key =
      ParseJobSpec("env:\n  \xed\xa0\x80: x\n", SpecFormat::kYaml, "u.yaml");  // a surrogate
  EXPECT_THAT(ErrorLines(key.status()), ElementsAre("u.yaml:2:3: invalid YAML: invalid UTF-8"));
  absl::StatusOr<JobSpec> inline_ds =
      ParseJobSpec("deepspeed:\n  x: \"\xff\"\n", SpecFormat::kYaml, "u.yaml");
  EXPECT_THAT(ErrorLines(inline_ds.status()),
              ElementsAre("u.yaml:2:6: invalid YAML: invalid UTF-8"));
  absl::StatusOr<JobSpec> from_json =
      ParseJobSpec("{\"env\": {\"A\": \"\xff\"}}", SpecFormat::kJson, "u.json");
  ASSERT_EQ(from_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(from_json.status().message()), StartsWith("u.json:1:"));
  // Well-formed multi-byte text is fine.
  absl::StatusOr<JobSpec> ok =
      ParseJobSpec("labels:\n  owner: \"J\xc3\xbcrgen \xe2\x9c\x93 \xf0\x9f\x9a\x80\"\n",
                   SpecFormat::kYaml, "u.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->labels().at("owner"), "J\xc3\xbcrgen \xe2\x9c\x93 \xf0\x9f\x9a\x80");
}

TEST(ParseJobSpecTest, TopLevelMustBeAMapping) {
  absl::StatusOr<JobSpec> list = ParseJobSpec("- kind: sft\n", SpecFormat::kYaml, "l.yaml");
  EXPECT_THAT(ErrorLines(list.status()),
              ElementsAre("l.yaml: a job spec must be a mapping, got a list"));
  absl::StatusOr<JobSpec> empty = ParseJobSpec("", SpecFormat::kYaml, "e.yaml");
  EXPECT_THAT(ErrorLines(empty.status()),
              ElementsAre("e.yaml: a job spec must be a mapping, got null"));
  absl::StatusOr<JobSpec> scalar = ParseJobSpec("42", SpecFormat::kJson, "s.json");
  EXPECT_THAT(ErrorLines(scalar.status()),
              ElementsAre("s.json: a job spec must be a mapping, got 42"));
}

TEST(ParseJobSpecTest, UnknownFieldSuggestsTheNearestName) {
  absl::StatusOr<JobSpec> spec = ParseYaml("training:\n  lerning_rate: 1e-5\n");
  EXPECT_THAT(
      ErrorLines(spec.status()),
      ElementsAre("spec.training.lerning_rate: unknown field (did you mean 'learning_rate'?)"));

  absl::StatusOr<JobSpec> top = ParseYaml("ouput_dir: ./o\n");
  EXPECT_THAT(ErrorLines(top.status()),
              ElementsAre("spec.ouput_dir: unknown field (did you mean 'output_dir'?)"));

  absl::StatusOr<JobSpec> far = ParseYaml("resources:\n  accelerators: 8\n");
  EXPECT_THAT(ErrorLines(far.status()), ElementsAre("spec.resources.accelerators: unknown field"));
}

TEST(ParseJobSpecTest, WrongTypesNameThePath) {
  absl::StatusOr<JobSpec> spec = ParseYaml("resources:\n  slots_per_node: x\n");
  EXPECT_THAT(ErrorLines(spec.status()),
              ElementsAre("spec.resources.slots_per_node: must be an integer, got \"x\""));
}

TEST(ParseJobSpecTest, EveryParseErrorIsReportedOnItsOwnLine) {
  absl::StatusOr<JobSpec> spec = ParseYaml(R"(
kind: sft
training:
  learning_rate: fast
  bf16: maybe
  lerning_rate: 1
resources: 8
env:
  A: [1]
stages:
  - training: {seed: x}
)");
  EXPECT_THAT(
      ErrorLines(spec.status()),
      UnorderedElementsAre(
          "spec.training.learning_rate: must be a number, got \"fast\"",
          "spec.training.bf16: must be true or false, got \"maybe\"",
          "spec.training.lerning_rate: unknown field (did you mean 'learning_rate'?)",
          "spec.resources: must be a mapping, got 8", "spec.env.A: must be a string, got a list",
          "spec.stages[0].training.seed: must be an integer, got \"x\""));
}

TEST(ParseJobSpecTest, OutOfRangeInt32IsAnError) {
  absl::StatusOr<JobSpec> spec = ParseYaml("resources:\n  nodes: 3000000000\n");
  EXPECT_THAT(
      ErrorLines(spec.status()),
      ElementsAre("spec.resources.nodes: out of range for a 32-bit integer, got 3000000000"));
}

// --- Defaults --------------------------------------------------------------------------------

TEST(ApplyJobSpecDefaultsTest, FillsTheHfTrainerDefaults) {
  JobSpec spec;
  spec.set_kind(trainctl::v1::JOB_KIND_SFT);
  spec.set_model_name_or_path("Qwen/Qwen2-VL-7B-Instruct");
  ApplyJobSpecDefaults(&spec);
  const auto& t = spec.training();
  EXPECT_EQ(t.per_device_train_batch_size(), 8);
  EXPECT_EQ(t.per_device_eval_batch_size(), 8);
  EXPECT_EQ(t.gradient_accumulation_steps(), 1);
  EXPECT_DOUBLE_EQ(t.learning_rate(), 5e-5);
  EXPECT_DOUBLE_EQ(t.num_train_epochs(), 3.0);
  EXPECT_EQ(t.max_steps(), -1);
  ASSERT_TRUE(t.has_bf16());
  EXPECT_FALSE(t.bf16());
  ASSERT_TRUE(t.has_fp16());
  EXPECT_FALSE(t.fp16());
  EXPECT_FALSE(t.has_tf32());  // no default: the backend's own
  EXPECT_DOUBLE_EQ(t.logging_steps(), 500);
  EXPECT_EQ(t.save_strategy(), "steps");
  EXPECT_DOUBLE_EQ(t.save_steps(), 500);
  EXPECT_FALSE(t.has_save_total_limit());
  EXPECT_DOUBLE_EQ(t.max_grad_norm(), 1.0);
  EXPECT_DOUBLE_EQ(t.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(t.adam_beta1(), 0.9);
  EXPECT_DOUBLE_EQ(t.adam_beta2(), 0.999);
  EXPECT_DOUBLE_EQ(t.adam_epsilon(), 1e-8);
  EXPECT_DOUBLE_EQ(t.warmup_ratio(), 0.0);
  EXPECT_EQ(t.warmup_steps(), 0);
  EXPECT_EQ(t.lr_scheduler_type(), "linear");
  EXPECT_EQ(t.seed(), 42);
  EXPECT_FALSE(t.gradient_checkpointing());
  EXPECT_EQ(t.max_pixels(), 12845056);
  EXPECT_EQ(t.min_pixels(), 3136);
  EXPECT_EQ(t.max_prompt_length(), 512);
  EXPECT_EQ(t.max_completion_length(), 256);
  EXPECT_EQ(t.num_generations(), 8);
  EXPECT_DOUBLE_EQ(t.beta(), 0.0);  // TRL's since v0.19 (the GRPO defaults: job_spec_grpo_test)
  EXPECT_EQ(spec.resources().nodes(), 1);
  EXPECT_EQ(spec.resources().slots_per_node(), 1);
  ASSERT_TRUE(spec.has_max_restarts());
  EXPECT_EQ(spec.max_restarts(), 0);
  EXPECT_EQ(spec.name(), "sft-qwen2-vl-7b-instruct");
}

TEST(ApplyJobSpecDefaultsTest, KeepsWhatIsSetAndIsIdempotent) {
  absl::StatusOr<JobSpec> spec = ParseYaml(kSeedYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_max_grad_norm(0.0);  // set to zero is not unset
  JobSpec once = *spec;
  ApplyJobSpecDefaults(&once);
  EXPECT_EQ(once.name(), "seed");
  EXPECT_EQ(once.training().per_device_train_batch_size(), 4);
  EXPECT_DOUBLE_EQ(once.training().learning_rate(), 2e-5);
  EXPECT_EQ(once.training().save_strategy(), "epoch");
  EXPECT_DOUBLE_EQ(once.training().max_grad_norm(), 0.0);
  EXPECT_EQ(once.resources().slots_per_node(), 8);
  EXPECT_EQ(once.max_restarts(), 2);
  JobSpec twice = once;
  ApplyJobSpecDefaults(&twice);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(once, twice));
}

// --- Validation ------------------------------------------------------------------------------

TEST(ValidateJobSpecTest, MinimalSpecIsValidWithDefaultsApplied) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kMinimalSpec);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->spec.training().per_device_train_batch_size(), 8);
  EXPECT_DOUBLE_EQ(v->spec.training().learning_rate(), 5e-5);
  EXPECT_DOUBLE_EQ(v->spec.training().num_train_epochs(), 3.0);
  EXPECT_DOUBLE_EQ(v->spec.training().logging_steps(), 500);
  EXPECT_EQ(v->spec.training().save_strategy(), "steps");
  EXPECT_DOUBLE_EQ(v->spec.training().max_grad_norm(), 1.0);
  EXPECT_EQ(v->spec.training().seed(), 42);
  EXPECT_EQ(v->spec.name(), "sft-qwen2-vl-2b-instruct");
  EXPECT_EQ(v->resolved_deepspeed_config_json, "");
  EXPECT_THAT(v->warnings, IsEmpty());
}

TEST(ValidateJobSpecTest, SlotsPerNodeZeroIsExactlyOneLine) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(std::string(kMinimalSpec) + "resources:\n  slots_per_node: 0\n");
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "spec.resources.slots_per_node: must be >= 1, got 0");
}

TEST(ValidateJobSpecTest, WorldSizeThatOverflowsIsAnError) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(
      std::string(kMinimalSpec) + "resources: {nodes: 65536, slots_per_node: 65536}\n");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.resources: nodes x slots_per_node must be at most 2147483647, got "
                          "4294967296"));
}

TEST(ValidateJobSpecTest, RequiredFields) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(JobSpec());
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.kind: required, one of distill|sft|grpo|eval|pipeline|probe",
                          "spec.model_name_or_path: required", "spec.data_path: required",
                          "spec.output_dir: required"));
}

TEST(ValidateJobSpecTest, EveryErrorIsReportedOneLineEachNamingItsPath) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(std::string(kMinimalSpec) + R"(
max_restarts: -1
resources:
  nodes: 0
  slots_per_node: -2
training:
  per_device_train_batch_size: 0
  gradient_accumulation_steps: 0
  learning_rate: -1
  max_steps: -5
  logging_steps: 0
  save_strategy: sometimes
  save_total_limit: 0
  max_grad_norm: -1
  weight_decay: -0.1
  adam_beta1: 1
  adam_beta2: -0.5
  adam_epsilon: 0
  warmup_ratio: 1.5
  warmup_steps: -1
  lr_scheduler_type: exotic
  min_pixels: 0
env:
  1BAD: x
node_selector:
  gpu: ""
)");
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre(
          "spec.resources.nodes: must be >= 1, got 0",
          "spec.resources.slots_per_node: must be >= 1, got -2",
          "spec.max_restarts: must be >= 0, got -1",
          "spec.training.per_device_train_batch_size: must be >= 1, got 0",
          "spec.training.gradient_accumulation_steps: must be >= 1, got 0",
          "spec.training.learning_rate: must be > 0, got -1",
          "spec.training.max_steps: must be > 0, or -1 to use num_train_epochs, got -5",
          "spec.training.logging_steps: must be > 0, got 0",
          "spec.training.save_strategy: must be one of no|steps|epoch, got 'sometimes'",
          "spec.training.save_total_limit: must be >= 1, got 0",
          "spec.training.max_grad_norm: must be >= 0, got -1",
          "spec.training.weight_decay: must be >= 0, got -0.1",
          "spec.training.adam_beta1: must be in [0, 1), got 1",
          "spec.training.adam_beta2: must be in [0, 1), got -0.5",
          "spec.training.adam_epsilon: must be > 0, got 0",
          "spec.training.warmup_ratio: must be in [0, 1], got 1.5",
          "spec.training.warmup_steps: must be >= 0, got -1",
          "spec.training.lr_scheduler_type: must be one of "
          "linear|cosine|cosine_with_restarts|polynomial|constant|constant_with_warmup|"
          "inverse_sqrt|reduce_lr_on_plateau|cosine_with_min_lr|warmup_stable_decay, got 'exotic'",
          "spec.training.min_pixels: must be >= 1, got 0",
          "spec.env.1BAD: not a valid environment variable name",
          "spec.node_selector.gpu: value must not be empty"));
}

TEST(ValidateJobSpecTest, BothPrecisionsIsAnError) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(std::string(kMinimalSpec) + "training:\n  bf16: true\n  fp16: true\n");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.fp16: bf16 and fp16 cannot both be enabled"));
}

TEST(ValidateJobSpecTest, ReservedEnvironmentVariablesAreRejected) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(std::string(kMinimalSpec) +
                   "env:\n  RANK: 3\n  MASTER_PORT: 1\n  NCCL_DEBUG: INFO\n  TRAINCTL_JOB_ID: j\n");
  EXPECT_THAT(
      ErrorLines(v.status()),
      UnorderedElementsAre("spec.env.MASTER_PORT: set by the worker for each rank; remove it",
                           "spec.env.RANK: set by the worker for each rank; remove it",
                           "spec.env.TRAINCTL_JOB_ID: set by the worker for each rank; remove it"));
}

TEST(ValidateJobSpecTest, MaxStepsOverridesEpochs) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(
      std::string(kMinimalSpec) + "training:\n  max_steps: 100\n  num_train_epochs: 0\n");
  EXPECT_TRUE(v.ok()) << v.status();
  absl::StatusOr<ValidatedJobSpec> bad =
      ValidateYaml(std::string(kMinimalSpec) + "training:\n  num_train_epochs: 0\n");
  EXPECT_THAT(ErrorLines(bad.status()),
              ElementsAre("spec.training.num_train_epochs: must be > 0, got 0"));
}

TEST(ValidateJobSpecTest, MaxPixelsBelowMinPixels) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(
      std::string(kMinimalSpec) + "training:\n  min_pixels: 1000\n  max_pixels: 999\n");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.training.max_pixels: must be >= min_pixels (1000), got 999"));
}

TEST(ValidateJobSpecTest, DeepSpeedPathThatWasNotEmbeddedIsAnError) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(std::string(kMinimalSpec) + "deepspeed: ./ds.json\n");
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()),
              StartsWith("spec.deepspeed_config_json: empty: the DeepSpeed file './ds.json'"));
  EXPECT_THAT(Lines(v.status().message()), SizeIs(1));
}

TEST(ValidateJobSpecTest, FieldErrorsComeFirstWithTheChecksOfEveryOtherField) {
  std::vector<std::string> field_errors;
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(std::string(kMinimalSpec) +
                       "training: {lerning_rate: 1, adam_beta1: 2}\nname: [x]\n"
                       "resources: {nodes: 0}\n",
                   SpecFormat::kYaml, "job.yaml", &field_errors);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(field_errors, UnorderedElementsAre(HasSubstr("spec.training.lerning_rate: unknown"),
                                                 "spec.name: must be a string, got a list"));
  EXPECT_THAT(
      ErrorLines(ValidateJobSpec(*spec, field_errors).status()),
      ElementsAre(field_errors[0], field_errors[1], "spec.resources.nodes: must be >= 1, got 0",
                  "spec.training.adam_beta1: must be in [0, 1), got 2"));
  // A check of a field that did not decode would only repeat it.
  JobSpec empty_dir = *spec;
  empty_dir.clear_output_dir();
  EXPECT_THAT(
      ErrorLines(ValidateJobSpec(empty_dir, {"spec.output_dir: must be a string"}).status()),
      Not(Contains("spec.output_dir: required")));
}

TEST(ValidateJobSpecTest, EnumValuesAndFieldNumbersThisBuildDoesNotKnowAreErrors) {
  absl::StatusOr<JobSpec> spec = ParseYaml(kMinimalSpec);
  ASSERT_TRUE(spec.ok());
  spec->set_kind(static_cast<JobKind>(42));
  spec->GetReflection()->MutableUnknownFields(&*spec)->AddVarint(99, 1);
  EXPECT_THAT(
      ErrorLines(ValidateJobSpec(*spec).status()),
      IsSupersetOf({"spec.kind: must be one of distill|sft|grpo|eval|pipeline|probe, got 42",
                    "spec: unknown field number 99 (trainctl.v1.JobSpec has no such field)"}));
  EXPECT_EQ(JobKindName(static_cast<JobKind>(42)), "unknown(42)");
}

TEST(ParseJobSpecTest, AliasExpansionAndNestingAreBounded) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char level = 'b'; level <= 'g'; ++level) {  // 10^6 nodes once expanded
    absl::StrAppend(&bomb, std::string(1, level), ": &", std::string(1, level), " [");
    for (int i = 0; i < 10; ++i)
      absl::StrAppend(&bomb, i ? "," : "", "*", std::string(1, level - 1));
    absl::StrAppend(&bomb, "]\n");
  }
  EXPECT_THAT(ErrorLines(ParseYaml(bomb).status()),
              ElementsAre(AllOf(StartsWith("job.yaml:"),
                                HasSubstr("more than 100000 nodes with its aliases expanded"))));
  EXPECT_THAT(
      ErrorLines(ParseYaml("kind: " + std::string(65, '[') + std::string(65, ']')).status()),
      ElementsAre(HasSubstr("nested deeper than 64 levels (the limit)")));
  EXPECT_THAT(ErrorLines(ParseJobSpec(std::string(kMaxSpecDocumentBytes + 1, '#'),
                                      SpecFormat::kYaml, "big.yaml")
                             .status()),
              ElementsAre("big.yaml: 1048577 bytes, over the limit of 1048576 bytes"));
}

TEST(ValidateJobSpecTest, SizesOverTheLimitsAreErrorsNamingTheLimit) {
  absl::StatusOr<JobSpec> spec = ParseYaml(kMinimalSpec);
  ASSERT_TRUE(spec.ok());
  spec->set_data_path(std::string(5000, 'd'));
  for (int i = 0; i < 65; ++i) (*spec->mutable_labels())[absl::StrCat("k", i)] = "v";
  for (int i = 0; i < 17; ++i) spec->add_stages();
  EXPECT_THAT(ErrorLines(ValidateJobSpec(*spec).status()),
              IsSupersetOf({"spec.data_path: 5000 bytes, over the limit of 4096",
                            "spec.labels: 65 entries, over the limit of 64",
                            "spec.stages: 17 stages, over the limit of 16"}));
}

}  // namespace
}  // namespace trainctl

namespace trainctl {
namespace {

// packing (TRL SFTConfig's): off by default with rows of 1024 tokens; sft and grpo take it, an
// eval job is refused naming the key, and a row length below 1 is refused.
TEST(PackingSpecTest, SftAndGrpoPackRowsOfMaxSeqLengthAndOtherKindsAreRefused) {
  absl::StatusOr<ValidatedJobSpec> v = spec_testing::ValidateYaml(spec_testing::kMinimalSpec);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->spec.training().packing());
  EXPECT_EQ(v->spec.training().max_seq_length(), 1024);
  v = spec_testing::ValidateYaml(std::string(spec_testing::kMinimalSpec) +
                                 "training: {packing: true, max_seq_length: 4096}\n");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->spec.training().packing());
  EXPECT_EQ(v->spec.training().max_seq_length(), 4096);
  v = spec_testing::ValidateYaml(std::string(spec_testing::kMinimalSpec) +
                                 "training: {max_seq_length: 0}\n");
  EXPECT_THAT(spec_testing::ErrorLines(v.status()),
              ::testing::ElementsAre("spec.training.max_seq_length: must be >= 1, got 0"));
  std::string grpo = spec_testing::kMinimalSpec;
  grpo.replace(grpo.find("kind: sft"), 9, "kind: grpo");
  v = spec_testing::ValidateYaml(grpo + "reward_funcs: [accuracy]\ntraining: {packing: true}\n");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->spec.training().packing());
  std::string eval = spec_testing::kMinimalSpec;
  eval.replace(eval.find("kind: sft"), 9, "kind: eval");
  v = spec_testing::ValidateYaml(eval + "training: {packing: true}\n");
  EXPECT_THAT(spec_testing::ErrorLines(v.status()),
              ::testing::Contains("spec.training.packing: only sft, grpo and logit distillation "
                                  "(distill_loss) jobs pack samples"));
}

}  // namespace
}  // namespace trainctl
