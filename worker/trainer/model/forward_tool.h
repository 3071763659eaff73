// The model tools' options (`trainctl-trainer forward` and `generate`:
// worker/trainer/forward_tool.h, generate_tool.h): device, dtype and attention implementation.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_FORWARD_TOOL_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_FORWARD_TOOL_H_

#include <torch/torch.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/trainer/model/attention.h"

namespace trainctl::model {

struct ForwardOptions {
  torch::Device device{torch::kCPU};
  torch::ScalarType dtype = torch::kFloat32;  // the weights' and activations' dtype
  AttentionImpl attention = AttentionImpl::kAuto;
};

// The tool's flags: `--device cpu|cuda[:N]`, `--dtype float32|bfloat16`, `--attention
// auto|eager|sdpa` (absent: the defaults above). INVALID_ARGUMENT naming the flag; CUDA asked of
// a machine without it is FAILED_PRECONDITION.
absl::StatusOr<ForwardOptions> ParseForwardOptions(const std::string& device,
                                                   const std::string& dtype,
                                                   const std::string& attention);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_FORWARD_TOOL_H_
