// Pipelines, the DeepSpeed config resolved against a spec, and the example specs in configs/.
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
#include "common/job_spec.h"
#include "common/pipeline_spec.h"
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

constexpr char kPipeline[] = R"(
kind: pipeline
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
teacher_endpoint: http://teacher:8000/v1
data_path: ./data
output_dir: ./ckpt
resources: {slots_per_node: 8}
training:
  per_device_train_batch_size: 4
  learning_rate: 2e-5
  bf16: true
stages:
  - name: distill
    kind: distill
  - name: sft
    kind: sft
    output_dir: /elsewhere/sft
    training: {learning_rate: 1e-5, num_train_epochs: 1}
  - kind: grpo
    training: {per_device_train_batch_size: 2, num_generations: 16}
)";

TEST(PipelineTest, StagesInheritTheJobsTrainingArguments) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kPipeline);
  ASSERT_TRUE(v.ok()) << v.status();
  const JobSpec& spec = v->spec;
  ASSERT_EQ(spec.stages_size(), 3);

  const auto& distill = spec.stages(0).training();
  EXPECT_EQ(distill.per_device_train_batch_size(), 4);
  EXPECT_DOUBLE_EQ(distill.learning_rate(), 2e-5);
  EXPECT_TRUE(distill.bf16());
  EXPECT_DOUBLE_EQ(distill.num_train_epochs(), 3.0);  // the job's default
  EXPECT_EQ(distill.seed(), 42);

  const auto& sft = spec.stages(1).training();
  EXPECT_DOUBLE_EQ(sft.learning_rate(), 1e-5);  // the stage's own wins
  EXPECT_DOUBLE_EQ(sft.num_train_epochs(), 1.0);
  EXPECT_EQ(sft.per_device_train_batch_size(), 4);
  EXPECT_TRUE(sft.bf16());

  const auto& grpo = spec.stages(2).training();
  EXPECT_EQ(grpo.per_device_train_batch_size(), 2);
  EXPECT_EQ(grpo.num_generations(), 16);
  EXPECT_DOUBLE_EQ(grpo.learning_rate(), 2e-5);
}

TEST(PipelineTest, StageNamesOutputDirsAndFirstStageInputsDefault) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(kPipeline);
  ASSERT_TRUE(v.ok()) << v.status();
  const JobSpec& spec = v->spec;
  EXPECT_EQ(spec.name(), "pipeline-qwen2-vl-7b-instruct");
  EXPECT_EQ(spec.stages(0).output_dir(), "./ckpt/distill");
  EXPECT_EQ(spec.stages(1).output_dir(), "/elsewhere/sft");  // set explicitly
  EXPECT_EQ(spec.stages(2).name(), "grpo-2");
  EXPECT_EQ(spec.stages(2).output_dir(), "./ckpt/grpo-2");
  // The first stage reads the job's model and data; later ones the previous stage's output.
  EXPECT_EQ(spec.stages(0).model_name_or_path(), "Qwen/Qwen2-VL-7B-Instruct");
  EXPECT_EQ(spec.stages(0).data_path(), "./data");
  EXPECT_EQ(spec.stages(1).model_name_or_path(), "");
  EXPECT_EQ(spec.stages(1).data_path(), "");
}

TEST(PipelineTest, DuplicateStageNamesAreAnError) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
model_name_or_path: m
data_path: d
output_dir: o
stages:
  - {name: train, kind: sft}
  - {name: train, kind: grpo}
)");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.stages[1].name: duplicate stage name 'train'"));
}

TEST(PipelineTest, StageErrorsNameTheStage) {
  absl::StatusOr<ValidatedJobSpec> v = ValidateYaml(R"(
kind: pipeline
output_dir: o
resources: {slots_per_node: 8}
stages:
  - {name: a}
  - {name: b, kind: pipeline}
  - {name: c, kind: grpo, training: {num_generations: 3}}
  - {name: d, kind: sft, training: {learning_rate: 0}}
)");
  // Stages c and d have nothing to take their inputs from (common/pipeline_spec.h): no earlier
  // stage trains a model for c (d takes c's), none makes a dataset, and the job names neither.
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre(
          "spec.stages[0].kind: required, one of distill|sft|grpo|eval",
          "spec.stages[1].kind: required, one of distill|sft|grpo|eval",
          "spec.stages[2].model_name_or_path: required (no earlier stage trains a model: sft, "
          "grpo, distill with distill_loss; and spec.model_name_or_path is empty)",
          "spec.stages[2].data_path: required (the previous stage makes no dataset: only trace "
          "distillation does; and spec.data_path is empty)",
          "spec.stages[2].training.num_generations: must divide the completions of one step (world "
          "8 x per_device_train_batch_size 8 x gradient_accumulation_steps 1 = 64), got 3",
          "spec.stages[3].data_path: required (the previous stage makes no dataset: only trace "
          "distillation does; and spec.data_path is empty)",
          "spec.stages[3].training.learning_rate: must be > 0, got 0"));
}

TEST(PipelineTest, NeedsAtLeastOneStage) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml("kind: pipeline\nmodel_name_or_path: m\ndata_path: d\noutput_dir: o\n");
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre("spec.stages: a pipeline needs at least one stage"));
}

TEST(PipelineTest, DeepSpeedIsResolvedPerStage) {
  JobSpec spec;
  absl::StatusOr<JobSpec> parsed = ParseYaml(kPipeline);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  spec = *parsed;
  spec.set_deepspeed_config_json(ReadTextFile(kSeedDeepSpeed));
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const json per_stage = json::parse(v->resolved_deepspeed_config_json);
  ASSERT_TRUE(per_stage.is_object());
  EXPECT_EQ(per_stage.size(), 3u);
  // 8 ranks x micro 4 x accum 1; the GRPO stage overrides micro to 2.
  EXPECT_EQ(per_stage["distill"]["train_batch_size"], 32);
  EXPECT_EQ(per_stage["sft"]["train_batch_size"], 32);
  EXPECT_EQ(per_stage["grpo-2"]["train_batch_size"], 16);
  EXPECT_EQ(per_stage["grpo-2"]["train_micro_batch_size_per_gpu"], 2);
  EXPECT_EQ(per_stage["sft"]["zero_optimization"]["reduce_bucket_size"], 3584 * 3584);
}

TEST(PipelineTest, DeepSpeedErrorsNameTheStage) {
  absl::StatusOr<JobSpec> parsed = ParseYaml(kPipeline);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  parsed->set_deepspeed_config_json(R"({"train_micro_batch_size_per_gpu": 4})");
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(*parsed);
  EXPECT_THAT(ErrorLines(v.status()),
              ElementsAre(AllOf(StartsWith("spec.deepspeed.train_micro_batch_size_per_gpu: "),
                                HasSubstr("--per_device_train_batch_size 2"),
                                HasSubstr("(stage grpo-2)"))));
}

// --- DeepSpeed -------------------------------------------------------------------------------

using testing::SeedJobSpec;

TEST(ValidateDeepSpeedTest, SeedConfigResolvesAgainstTheSeedFlags) {
  const JobSpec spec = SeedJobSpec();
  ASSERT_FALSE(spec.deepspeed_config_json().empty());
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const json resolved = json::parse(v->resolved_deepspeed_config_json);
  EXPECT_EQ(resolved["train_batch_size"], 128);
  EXPECT_EQ(resolved["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(resolved["gradient_accumulation_steps"], 4);
  EXPECT_EQ(resolved["zero_optimization"]["reduce_bucket_size"], 12845056);  // 3584^2
  EXPECT_EQ(resolved["zero_optimization"]["stage3_prefetch_bucket_size"], 11560550);
  EXPECT_EQ(resolved["zero_optimization"]["stage3_param_persistence_threshold"], 35840);
  EXPECT_EQ(resolved["bf16"]["enabled"], true);
  // Every warning names its spec path.
  EXPECT_THAT(v->warnings, Each(StartsWith("spec.deepspeed.")));
}

TEST(ValidateDeepSpeedTest, LocalModelConfigDrivesHiddenSizeAutos) {
  ScratchDir dir;
  dir.Write("model/config.json", R"({"model_type": "qwen2_vl", "hidden_size": 64})");
  JobSpec spec = SeedJobSpec();
  spec.set_model_name_or_path(dir.path() + "/model");
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const json resolved = json::parse(v->resolved_deepspeed_config_json);
  EXPECT_EQ(resolved["zero_optimization"]["reduce_bucket_size"], 4096);
  EXPECT_EQ(resolved["zero_optimization"]["stage3_param_persistence_threshold"], 640);
}

TEST(ValidateDeepSpeedTest, UnknownModelLeavesHiddenSizeAutosWithAWarning) {
  JobSpec spec = SeedJobSpec();
  spec.set_model_name_or_path("someone/unknown-model");
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const json resolved = json::parse(v->resolved_deepspeed_config_json);
  EXPECT_EQ(resolved["zero_optimization"]["reduce_bucket_size"], "auto");
  EXPECT_THAT(v->warnings,
              Contains(StartsWith("spec.deepspeed.zero_optimization.reduce_bucket_size: ")));
}

TEST(ValidateDeepSpeedTest, InconsistentTrainBatchSizeIsPrefixed) {
  JobSpec spec = SeedJobSpec();
  json doc = json::parse(spec.deepspeed_config_json());
  doc["train_batch_size"] = 64;
  spec.set_deepspeed_config_json(doc.dump());
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  EXPECT_THAT(
      ErrorLines(v.status()),
      ElementsAre(AllOf(StartsWith("spec.deepspeed.train_batch_size: 64"), HasSubstr("128"))));
}

TEST(ValidateDeepSpeedTest, ExplicitValueDisagreeingWithAFlagIsAnError) {
  JobSpec spec = SeedJobSpec();
  json doc = json::parse(spec.deepspeed_config_json());
  doc["gradient_accumulation_steps"] = 2;
  doc["bf16"]["enabled"] = false;
  spec.set_deepspeed_config_json(doc.dump());
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  const std::vector<std::string> lines = ErrorLines(v.status());
  EXPECT_THAT(lines, Each(StartsWith("spec.deepspeed.")));
  EXPECT_THAT(lines, Contains(AllOf(StartsWith("spec.deepspeed.gradient_accumulation_steps: "),
                                    HasSubstr("--gradient_accumulation_steps 4"))));
  EXPECT_THAT(lines, Contains(StartsWith("spec.deepspeed.bf16.enabled: ")));
}

TEST(ValidateDeepSpeedTest, SyntaxErrorInEmbeddedDocumentNamesTheSource) {
  JobSpec spec = SeedJobSpec();
  spec.set_deepspeed_config_json("{\"zero_optimization\": ");
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()),
              StartsWith("spec.deepspeed: ./configs/ds_zero3_bf16.json"));

  spec.clear_deepspeed();
  v = ValidateJobSpec(spec);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()),
              StartsWith("spec.deepspeed: spec.deepspeed_config_json"));
}

TEST(ValidateDeepSpeedTest, SpecErrorsAreReportedBeforeDeepSpeedIsResolved) {
  JobSpec spec = SeedJobSpec();
  spec.mutable_resources()->set_slots_per_node(0);
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(spec);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(), "spec.resources.slots_per_node: must be >= 1, got 0");
}

// --- Example specs ---------------------------------------------------------------------------

TEST(ExampleSpecsTest, EveryExampleLoadsAndValidates) {
  const std::filesystem::path dir = std::filesystem::path(kSourceDir) / "configs" / "examples";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string path = entry.path().string();
    const std::string ext = entry.path().extension().string();
    if (ext != ".yaml" && ext != ".yml" && ext != ".json") continue;
    ++count;
    SCOPED_TRACE(path);
    absl::StatusOr<JobSpec> spec = LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(*spec);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_FALSE(v->resolved_deepspeed_config_json.empty());
  }
  EXPECT_GE(count, 3);
}

TEST(ExampleSpecsTest, SftExampleIsTheSeedsJob) {
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile(std::string(kSourceDir) + "/configs/examples/sft_qwen2vl_7b.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind(), trainctl::v1::JOB_KIND_SFT);
  EXPECT_EQ(spec->model_name_or_path(), "Qwen/Qwen2-VL-7B-Instruct");
  EXPECT_EQ(spec->data_path(), "./data/processed_multimodal");
  EXPECT_EQ(spec->output_dir(), "./checkpoints/qwen2vl_r1");
  EXPECT_EQ(spec->deepspeed_config_json(), ReadTextFile(kSeedDeepSpeed));
  EXPECT_EQ(spec->resources().nodes(), 1);
  EXPECT_EQ(spec->resources().slots_per_node(), 8);
  EXPECT_EQ(spec->env().at("NCCL_DEBUG"), "INFO");
  const auto& t = spec->training();
  EXPECT_EQ(t.per_device_train_batch_size(), 4);
  EXPECT_EQ(t.gradient_accumulation_steps(), 4);
  EXPECT_DOUBLE_EQ(t.learning_rate(), 2e-5);
  EXPECT_DOUBLE_EQ(t.num_train_epochs(), 3);
  EXPECT_TRUE(t.bf16());
  EXPECT_TRUE(t.tf32());
  EXPECT_DOUBLE_EQ(t.logging_steps(), 10);
  EXPECT_EQ(t.save_strategy(), "epoch");

  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(*spec);
  ASSERT_TRUE(v.ok()) << v.status();
  const json resolved = json::parse(v->resolved_deepspeed_config_json);
  EXPECT_EQ(resolved["train_batch_size"], 128);
  EXPECT_EQ(resolved["zero_optimization"]["reduce_bucket_size"], 12845056);
}

TEST(ExampleSpecsTest, PipelineExampleRunsDistillSftGrpoEval) {
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile(std::string(kSourceDir) + "/configs/examples/pipeline_r1.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(*spec);
  ASSERT_TRUE(v.ok()) << v.status();
  std::vector<JobKind> kinds;
  for (const auto& stage : v->spec.stages()) kinds.push_back(stage.kind());
  EXPECT_THAT(kinds, ElementsAre(trainctl::v1::JOB_KIND_DISTILL, trainctl::v1::JOB_KIND_SFT,
                                 trainctl::v1::JOB_KIND_GRPO, trainctl::v1::JOB_KIND_EVAL));
  EXPECT_EQ(v->spec.env().at("NCCL_IB_DISABLE"), "0");
  // The chain: sft trains on the distilled dataset; grpo and eval take the stage before's model.
  const std::string out = v->spec.output_dir();
  std::vector<std::string> models, data;
  for (int i = 0; i < v->spec.stages_size(); ++i) {
    absl::StatusOr<JobSpec> stage = PipelineStageSpec(v->spec, i);
    ASSERT_TRUE(stage.ok()) << stage.status();
    models.push_back(stage->model_name_or_path());
    data.push_back(stage->data_path());
  }
  EXPECT_THAT(models, ElementsAre("Qwen/Qwen2-VL-7B-Instruct", "Qwen/Qwen2-VL-7B-Instruct",
                                  out + "/sft", out + "/grpo"));
  EXPECT_THAT(data, ElementsAre("./data/raw_multimodal", out + "/distill/dataset",
                                "./data/processed_multimodal", "./data/eval_multimodal"));
}

// The CPU sibling the demo submits: valid, the same four stages, the same chain.
TEST(ExampleSpecsTest, CpuPipelineExampleIsTheDemosChain) {
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile(std::string(kSourceDir) + "/configs/examples/pipeline_r1_cpu.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<ValidatedJobSpec> v = ValidateJobSpec(*spec);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->spec.stages_size(), 4);
  absl::StatusOr<JobSpec> sft = PipelineStageSpec(v->spec, 1);
  absl::StatusOr<JobSpec> eval = PipelineStageSpec(v->spec, 3);
  ASSERT_TRUE(sft.ok() && eval.ok());
  EXPECT_EQ(sft->data_path(), v->spec.output_dir() + "/distill/dataset");
  EXPECT_EQ(eval->model_name_or_path(), v->spec.output_dir() + "/grpo");
  EXPECT_EQ(eval->baseline_model_name_or_path(), "./var/demo/base");
  EXPECT_FALSE(eval->training().bf16());
}

TEST(JobKindNameTest, ShortLowerCaseNames) {
  EXPECT_EQ(JobKindName(trainctl::v1::JOB_KIND_DISTILL), "distill");
  EXPECT_EQ(JobKindName(trainctl::v1::JOB_KIND_SFT), "sft");
  EXPECT_EQ(JobKindName(trainctl::v1::JOB_KIND_GRPO), "grpo");
  EXPECT_EQ(JobKindName(trainctl::v1::JOB_KIND_EVAL), "eval");
  EXPECT_EQ(JobKindName(trainctl::v1::JOB_KIND_PIPELINE), "pipeline");
}

TEST(ValidateJobSpecTest, StagesOnlyForPipelines) {
  absl::StatusOr<ValidatedJobSpec> v =
      ValidateYaml(std::string(kMinimalSpec) + "stages:\n  - {name: a, kind: sft}\n");
  EXPECT_THAT(ErrorLines(v.status()), ElementsAre("spec.stages: only a pipeline job has stages"));
}

}  // namespace
}  // namespace trainctl
