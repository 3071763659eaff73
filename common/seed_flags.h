// The seed's launch flags as a way to write a job spec:
//
//   trainctl submit --kind sft --num_gpus=8 src/train_multimodal.py --model_name_or_path M
//       --data_path D --deepspeed ./configs/ds_zero3_bf16.json --per_device_train_batch_size 4 ...
//
// Launcher flags (--num_gpus, --nnodes) map onto spec.resources; every HF TrainingArguments flag
// the spec knows maps onto spec.training with the HF Trainer's meaning and value syntax (`--bf16
// True`,
// `--bf16=true`, bare `--bf16`); --model_name_or_path, --data_path, --deepspeed, --output_dir and
// the trainctl fields (--kind, --name, --priority, --max_restarts, --env K=V, --label K=V,
// --node_selector K=V) and GRPO's --reward_funcs, --reward_model_name_or_path map onto the spec's
// top level. List flags take every value up to the next flag, as HF's nargs="+" does
// (`--reward_funcs accuracy format`, `--reward_weights 1.0 0.5`).
#ifndef TRAINCTL_COMMON_SEED_FLAGS_H_
#define TRAINCTL_COMMON_SEED_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

struct FlagSpec {
  trainctl::v1::JobSpec spec;
  std::vector<std::string> warnings;  // e.g. the training script argument, which trainctl replaces
};

// Parses `args` (without the program and verb). A relative --deepspeed path is read relative to
// `base_dir` and embedded. INVALID_ARGUMENT names the flag: "--learning_rate: must be a number, got
// 'fast'", "--lerning_rate: unknown flag (did you mean --learning_rate?)". With `flag_errors`,
// those problems are appended there instead and the spec keeps every flag that parsed (for
// ValidateJobSpec to report them with its own).
absl::StatusOr<FlagSpec> JobSpecFromFlags(const std::vector<std::string>& args,
                                          const std::string& base_dir,
                                          std::vector<std::string>* flag_errors = nullptr);

// True when `name` (without dashes) is a flag JobSpecFromFlags understands.
bool IsSeedFlag(const std::string& name);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_SEED_FLAGS_H_
