// The seed document's launch line and DeepSpeed config (../shared/seed/SEED-en.md), as tests use
// them.
#ifndef TRAINCTL_TESTS_TESTING_SEED_H_
#define TRAINCTL_TESTS_TESTING_SEED_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "trainctl/v1/job.pb.h"

namespace trainctl::testing {

// The shipped copy of the seed's ds_zero3_bf16.json (byte-identical to the seed).
inline constexpr char kSeedDeepSpeedPath[] = TRAINCTL_SOURCE_DIR "/configs/ds_zero3_bf16.json";

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::string SeedDeepSpeedText() { return ReadTextFile(kSeedDeepSpeedPath); }

// The seed's launch line after the shell has expanded its variables and stripped its quotes:
//   deepspeed --num_gpus=8 src/train_multimodal.py --model_name_or_path $MODEL_ID ...
// Its --deepspeed path is relative to the repository root.
inline std::vector<std::string> SeedLaunchFlags() {
  return {"--num_gpus=8",
          "src/train_multimodal.py",
          "--model_name_or_path",
          "Qwen/Qwen2-VL-7B-Instruct",
          "--data_path",
          "./data/processed_multimodal",
          "--deepspeed",
          "./configs/ds_zero3_bf16.json",
          "--per_device_train_batch_size",
          "4",
          "--gradient_accumulation_steps",
          "4",
          "--learning_rate",
          "2e-5",
          "--num_train_epochs",
          "3",
          "--bf16",
          "True",
          "--tf32",
          "True",
          "--output_dir",
          "./checkpoints/qwen2vl_r1",
          "--logging_steps",
          "10",
          "--save_strategy",
          "epoch"};
}

// The seed's launch line as a JobSpec (what `trainctl submit --kind sft <seed flags>` builds), with
// the seed's DeepSpeed file embedded.
inline trainctl::v1::JobSpec SeedJobSpec() {
  trainctl::v1::JobSpec spec;
  spec.set_kind(trainctl::v1::JOB_KIND_SFT);
  spec.set_model_name_or_path("Qwen/Qwen2-VL-7B-Instruct");
  spec.set_data_path("./data/processed_multimodal");
  spec.set_output_dir("./checkpoints/qwen2vl_r1");
  spec.set_deepspeed("./configs/ds_zero3_bf16.json");
  spec.set_deepspeed_config_json(SeedDeepSpeedText());
  auto* t = spec.mutable_training();
  t->set_per_device_train_batch_size(4);
  t->set_gradient_accumulation_steps(4);
  t->set_learning_rate(2e-5);
  t->set_num_train_epochs(3);
  t->set_bf16(true);
  t->set_tf32(true);
  t->set_logging_steps(10);
  t->set_save_strategy("epoch");
  spec.mutable_resources()->set_slots_per_node(8);
  return spec;
}

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_SEED_H_
