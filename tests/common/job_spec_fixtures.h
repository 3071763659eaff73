// Shared by the job spec suites: parse/validate helpers and the specs they start from.
#ifndef TRAINCTL_TESTS_COMMON_JOB_SPEC_FIXTURES_H_
#define TRAINCTL_TESTS_COMMON_JOB_SPEC_FIXTURES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::spec_testing {

inline constexpr char kSourceDir[] = TRAINCTL_SOURCE_DIR;
inline constexpr const char* kSeedDeepSpeed = trainctl::testing::kSeedDeepSpeedPath;

using trainctl::testing::ReadTextFile;
using ScratchDir = trainctl::testing::TempDir;

inline std::vector<std::string> Lines(absl::string_view text) { return absl::StrSplit(text, '\n'); }

inline absl::StatusOr<JobSpec> ParseYaml(const std::string& text) {
  return ParseJobSpec(text, SpecFormat::kYaml, "job.yaml");
}

// Parses `yaml`, which must be valid, and validates it.
inline absl::StatusOr<ValidatedJobSpec> ValidateYaml(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return spec.status();
  return ValidateJobSpec(*spec);
}

// The messages of a failed status, one per line.
inline std::vector<std::string> ErrorLines(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return Lines(status.message());
}

// The smallest spec that validates: every required field and nothing else.
inline constexpr char kMinimalSpec[] = R"(
kind: sft
model_name_or_path: Qwen/Qwen2-VL-2B-Instruct
data_path: ./data
output_dir: ./out
)";

// The seed's job written as a spec, with the DeepSpeed config inline.
inline constexpr char kSeedYaml[] = R"(# the seed's launch script
name: seed
kind: sft
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
data_path: ./data/processed_multimodal
output_dir: "./checkpoints/qwen2vl_r1"
priority: 5
max_restarts: 2
training:
  per_device_train_batch_size: 4
  gradient_accumulation_steps: 4
  learning_rate: 2e-5
  num_train_epochs: 3
  bf16: true
  tf32: True
  logging_steps: 10
  save_strategy: "epoch"
resources:
  nodes: 1
  slots_per_node: 8
env:
  NCCL_DEBUG: INFO
  NCCL_IB_DISABLE: 0
  NCCL_NET_GDR_LEVEL: 2
labels:
  team: vlm
node_selector:
  gpu: h100
  fabric: infiniband
deepspeed:
  zero_optimization:
    stage: 3
    sub_group_size: 1e9
    reduce_bucket_size: auto
  bf16:
    enabled: true
  gradient_clipping: 1.0
  train_micro_batch_size_per_gpu: auto
  gradient_accumulation_steps: auto
)";

inline constexpr char kSeedJson[] = R"({
  "name": "seed",
  "kind": "sft",
  "model_name_or_path": "Qwen/Qwen2-VL-7B-Instruct",
  "data_path": "./data/processed_multimodal",
  "output_dir": "./checkpoints/qwen2vl_r1",
  "priority": 5,
  "max_restarts": 2,
  "training": {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "learning_rate": 2e-5,
    "num_train_epochs": 3,
    "bf16": true,
    "tf32": true,
    "logging_steps": 10,
    "save_strategy": "epoch"
  },
  "resources": {"nodes": 1, "slots_per_node": 8},
  "env": {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": 0, "NCCL_NET_GDR_LEVEL": 2},
  "labels": {"team": "vlm"},
  "node_selector": {"gpu": "h100", "fabric": "infiniband"},
  "deepspeed": {
    "zero_optimization": {"stage": 3, "sub_group_size": 1e9, "reduce_bucket_size": "auto"},
    "bf16": {"enabled": true},
    "gradient_clipping": 1.0,
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto"
  }
})";

}  // namespace trainctl::spec_testing

#endif  // TRAINCTL_TESTS_COMMON_JOB_SPEC_FIXTURES_H_
