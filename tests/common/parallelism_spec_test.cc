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

TEST(ParallelismSpecTest, RefusalsNameTheNumbers) {
  EXPECT_EQ(Validate(std::string(kBase) + "parallelism: {sequence_parallel_size: 4}\n"), "");
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {sequence_parallel_size: 3}\n"),
              HasSubstr("spec.parallelism.sequence_parallel_size: 3 does not divide "
                        "resources.slots_per_node 4"));
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {tensor_parallel_size: 2}\n"),
              HasSubstr("tensor parallelism is not built yet"));
  EXPECT_THAT(Validate(std::string(kBase) + "parallelism: {sequence_parallel_size: 0}\n"),
              HasSubstr("must be >= 1, got 0"));
  // tiny has 4 attention heads.
  EXPECT_THAT(Validate("kind: sft\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 8}\n"
                       "parallelism: {sequence_parallel_size: 8}\n"),
              HasSubstr("8 does not divide the model's 4 attention heads"));
  EXPECT_THAT(Validate("kind: grpo\nmodel_name_or_path: tiny\ndata_path: /d\noutput_dir: /o\n"
                       "resources: {nodes: 1, slots_per_node: 2}\n"
                       "parallelism: {sequence_parallel_size: 2}\n"),
              HasSubstr("built for sft jobs only"));
  EXPECT_THAT(Validate(std::string(kBase) +
                       "parallelism: {sequence_parallel_size: 2}\ntraining: {packing: true}\n"),
              HasSubstr("not with training.packing yet"));
}

}  // namespace
}  // namespace trainctl
