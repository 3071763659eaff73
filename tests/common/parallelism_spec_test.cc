// The device mesh of a spec (common/parallelism_spec.h): defaults, the layout of the groups, and
// the refusals, each naming the numbers.
#include "common/parallelism_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/job_spec.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;

std::string Validate(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml, SpecFormat::kYaml, "spec.yaml");
  if (!spec.ok()) return std::string(spec.status().message());
  auto validated = ValidateJobSpec(*spec);
  return validated.ok() ? "" : std::string(validated.status().message());
}

const char kBase[] =
    "kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
    "resources: {nodes: 2, slots_per_node: 4}\n";

TEST(ParallelismSpecTest, MeshLayoutPutsSequenceGroupsOnConsecutiveRanks) {
  trainctl::v1::JobSpec spec;
  spec.mutable_parallelism()->set_sequence_parallel_size(2);
  const DeviceMesh mesh = MeshOf(spec, 8);
  EXPECT_EQ(mesh.data, 4);
  EXPECT_EQ(mesh.sequence, 2);
  EXPECT_EQ(mesh.SequenceGroup(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.SequenceRank(5), 1);
  EXPECT_EQ(mesh.DataRank(5), 2);
  EXPECT_EQ(MeshOf(trainctl::v1::JobSpec(), 8).data, 8);
}

TEST(ParallelismSpecTest, MeshLayoutNestsTensorGroupsInSequenceGroups) {
  // r = (d * sequence + s) * tensor + t.
  trainctl::v1::JobSpec spec;
  spec.mutable_parallelism()->set_tensor_parallel_size(2);
  spec.mutable_parallelism()->set_sequence_parallel_size(2);
  const DeviceMesh mesh = MeshOf(spec, 8);
  EXPECT_EQ(mesh.data, 2);
  EXPECT_EQ(mesh.world(), 8);
  EXPECT_EQ(mesh.TensorGroup(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh.SequenceGroup(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh.ZeroGroup(5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(mesh.DataRank(5), 1);
  EXPECT_EQ(mesh.TensorRank(5), 1);
  EXPECT_EQ(mesh.SequenceRank(5), 0);
}

TEST(ParallelismSpecTest, MeshLayoutWithTensorParallelOnly) {
  trainctl::v1::JobSpec spec;
  spec.mutable_parallelism()->set_tensor_parallel_size(4);
  const DeviceMesh mesh = MeshOf(spec, 8);
  EXPECT_EQ(mesh.data, 2);
  EXPECT_EQ(mesh.sequence, 1);
  EXPECT_EQ(mesh.TensorGroup(6), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(mesh.TensorRank(6), 2);
  EXPECT_EQ(mesh.SequenceGroup(6), (std::vector<int>{6}));
  EXPECT_EQ(mesh.SequenceRank(6), 0);
  EXPECT_EQ(mesh.ZeroGroup(6), (std::vector<int>{2, 6}));
  EXPECT_EQ(mesh.DataRank(6), 1);
}

TEST(ParallelismSpecTest, TensorParallelRefusalsNameTheNumbers) {
  // tiny's MLP is 128 wide (intermediate_size): 3 does not divide it, though it divides 6 slots.
  EXPECT_THAT(Validate("kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 6}\n"
                       "parallelism: {tensor_parallel_size: 3}\n"),
              HasSubstr("spec.parallelism.tensor_parallel_size: 3 does not divide the model's "
                        "128-wide MLP (intermediate_size, "));
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {tensor_parallel_size: 8}\n"),
              HasSubstr("spec.parallelism.tensor_parallel_size: 8 does not divide "
                        "resources.slots_per_node 4: a tensor-parallel group's ranks must share "
                        "a node"));
  EXPECT_THAT(
      Validate(std::string(kBase) +
               "parallelism: {tensor_parallel_size: 2, sequence_parallel_size: 4}\n"),
      HasSubstr("tensor_parallel_size 2 x sequence_parallel_size 4 = 8 does not divide "
                "resources.slots_per_node 4: a tensor/sequence-parallel group's ranks must share "
                "a node"));
  EXPECT_EQ(Validate(std::string(kBase) +
                     "parallelism: {tensor_parallel_size: 2, sequence_parallel_size: 2}\n"),
            "");
  EXPECT_EQ(Validate("kind: grpo\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                     "resources: {nodes: 1, slots_per_node: 2}\nreward_funcs: [format]\n"
                     "parallelism: {tensor_parallel_size: 2}\n"),
            "");
  EXPECT_THAT(Validate("kind: eval\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 2}\n"
                       "parallelism: {tensor_parallel_size: 2}\n"),
              HasSubstr("spec.parallelism.tensor_parallel_size: built for sft, logit "
                        "distillation (distill with training.distill_loss) and grpo jobs only, "
                        "this job is JOB_KIND_EVAL"));
  // The vocabulary split over the tensor-parallel group: tiny's 151,936 tokens divide by 2.
  EXPECT_EQ(Validate(std::string(kBase) +
                     "parallelism: {tensor_parallel_size: 2, vocab_parallel: true}\n"),
            "");
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {vocab_parallel: true}\n"),
              HasSubstr("spec.parallelism.vocab_parallel: splits the vocabulary over the "
                        "tensor-parallel group: needs tensor_parallel_size > 1, got 1"));
  EXPECT_THAT(Validate("kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 6}\n"
                       "parallelism: {tensor_parallel_size: 3, vocab_parallel: true}\n"),
              HasSubstr("spec.parallelism.vocab_parallel: tensor_parallel_size 3 does not divide "
                        "the model's 151936-token vocabulary"));
  // DeepSpeed's train_batch_size counts data-parallel ranks: 8 ranks at tp 2 are 4.
  const std::string batch = std::string(kBase) +
                            "parallelism: {tensor_parallel_size: 2}\n"
                            "training: {per_device_train_batch_size: 2}\n";
  EXPECT_EQ(Validate(batch + "deepspeed_config_json: '{\"train_batch_size\": 8}'\n"), "");
  EXPECT_THAT(Validate(batch + "deepspeed_config_json: '{\"train_batch_size\": 16}'\n"),
              HasSubstr("16 != train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 1 "
                        "* data-parallel world_size 4 = 8"));
  // Logit distillation runs on the mesh, its teacher too; trace distillation does not.
  const std::string distill =
      "kind: distill\nmodel_name_or_path: tiny\nteacher_model_name_or_path: tiny-qwen2.5-vl\n"
      "data_path: /d\noutput_dir: /o\nresources: {nodes: 1, slots_per_node: 2}\n"
      "parallelism: {tensor_parallel_size: 2}\n";
  EXPECT_EQ(Validate(distill + "training: {distill_loss: forward_kl}\n"), "");
  EXPECT_THAT(Validate(distill), HasSubstr("this job is trace distillation"));
  // Packing is refused with sequence parallelism only.
  EXPECT_EQ(Validate(std::string(kBase) +
                     "parallelism: {tensor_parallel_size: 2}\ntraining: {packing: true}\n"),
            "");
}

// Tensor parallelism splits the attention heads too (tiny: 4 heads, 2 key/value heads), unless
// the MLPs alone are; sequence parallelism then splits a rank's share of the heads.
TEST(ParallelismSpecTest, TensorParallelSplitsAttentionHeadsUnlessMlpOnly) {
  const std::string tp4 = std::string(kBase) + "parallelism: {tensor_parallel_size: 4";
  EXPECT_THAT(Validate(tp4 + "}\n"),
              HasSubstr("spec.parallelism.tensor_parallel_size: 4 does not divide the model's 2 "
                        "key/value heads (num_key_value_heads, "));
  EXPECT_THAT(Validate(tp4 + "}\n"),
              HasSubstr("parallelism.tensor_parallel_mlp_only: true splits only the MLPs"));
  EXPECT_EQ(Validate(tp4 + ", tensor_parallel_mlp_only: true}\n"), "");
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {tensor_parallel_mlp_only: true}\n"),
              HasSubstr("spec.parallelism.tensor_parallel_mlp_only: says what the "
                        "tensor-parallel group splits: needs tensor_parallel_size > 1, got 1"));
  // Sequence parallelism then splits a tensor-parallel rank's 2 heads: 4 ranks cannot.
  const std::string eight =
      "kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
      "resources: {nodes: 1, slots_per_node: 8}\n"
      "parallelism: {tensor_parallel_size: 2, sequence_parallel_size: 4";
  EXPECT_THAT(Validate(eight + "}\n"),
              HasSubstr("spec.parallelism.sequence_parallel_size: 4 does not divide the model's "
                        "4 attention heads (num_attention_heads, "));
  EXPECT_THAT(Validate(eight + "}\n"), HasSubstr(") / tensor_parallel_size 2"));
  EXPECT_EQ(Validate(eight + ", tensor_parallel_mlp_only: true}\n"), "");
}

// A GRPO reward model scores whole sequences (a sequence-parallel group shares out its rows):
// its heads need not divide by sp, a distillation teacher's (split like the student) must.
TEST(ParallelismSpecTest, ARewardModelNeedNotSplitItsHeadsATeacherMust) {
  const std::string three =
      "model_name_or_path: Qwen/Qwen2-VL-2B-Instruct\ndata_path: /d\noutput_dir: /o\n"
      "resources: {nodes: 1, slots_per_node: 3}\nparallelism: {sequence_parallel_size: 3}\n";
  EXPECT_EQ(Validate("kind: grpo\nreward_model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\n" + three +
                     "training: {num_generations: 3}\n"),
            "");
  EXPECT_THAT(Validate("kind: distill\nteacher_model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\n" +
                       three + "training: {distill_loss: forward_kl}\n"),
              HasSubstr("spec.parallelism.sequence_parallel_size: 3 does not divide the "
                        "teacher's 28 attention heads"));
}

TEST(ParallelismSpecTest, RefusalsNameTheNumbers) {
  EXPECT_EQ(Validate(std::string(kBase) + "parallelism: {sequence_parallel_size: 4}\n"), "");
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {sequence_parallel_size: 3}\n"),
              HasSubstr("spec.parallelism.sequence_parallel_size: 3 does not divide "
                        "resources.slots_per_node 4"));
  EXPECT_EQ(Validate(std::string(kBase) + "parallelism: {tensor_parallel_size: 2}\n"), "");
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {tensor_parallel_size: 0}\n"),
              HasSubstr("spec.parallelism.tensor_parallel_size: must be >= 1, got 0"));
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {sequence_parallel_size: 0}\n"),
              HasSubstr("must be >= 1, got 0"));
  // tiny has 4 attention heads.
  EXPECT_THAT(Validate("kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 8}\n"
                       "parallelism: {sequence_parallel_size: 8}\n"),
              HasSubstr("8 does not divide the model's 4 attention heads"));
  EXPECT_EQ(Validate("kind: grpo\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                     "resources: {nodes: 1, slots_per_node: 2}\nreward_funcs: [format]\n"
                     "parallelism: {sequence_parallel_size: 2}\n"),
            "");
  EXPECT_THAT(Validate("kind: eval\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 2}\n"
                       "parallelism: {sequence_parallel_size: 2}\n"),
              HasSubstr("spec.parallelism.sequence_parallel_size: built for sft, logit "
                        "distillation (distill with training.distill_loss) and grpo jobs only, "
                        "this job is JOB_KIND_EVAL"));
  EXPECT_THAT(Validate(std::string(kBase) +
                       "parallelism: {sequence_parallel_size: 2}\ntraining: {packing: true}\n"),
              HasSubstr("not with training.packing yet"));
}

}  // namespace
}  // namespace trainctl
