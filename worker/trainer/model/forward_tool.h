// One forward pass of a saved model on a JSON request, writing the logits: the tool for comparing
// this implementation with another (HF transformers) on the same inputs. `trainctl-trainer
// forward --model DIR --request REQ.json --out OUT.safetensors` calls it.
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

// Loads the model in `model_dir` (config.json + safetensors weights) in options.dtype on
// options.device, runs it in eval mode without autograd on the request, and writes `logits`
// ([B, T, vocab] float32) to the safetensors file `out_path`.
//
// `request_json`: {"input_ids": [[...], ...], "attention_mask"?: [[...], ...] (same shape, 0/1),
// "pixel_values_file"?: "x.safetensors" (holding pixel_values [N, 1176] and image_grid_thw
// [n, 3]; a relative path is taken from the working directory)}.
//
// INVALID_ARGUMENT naming the field for a malformed request, or with the model's message for
// inputs it rejects (pad/feature count mismatch, ids out of range, ...); the loader's and the
// writer's errors otherwise.
absl::Status RunForward(const std::string& model_dir, const std::string& request_json,
                        const std::string& out_path, const ForwardOptions& options = {});

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_FORWARD_TOOL_H_
