// One forward pass of a saved model on a request file, writing the logits: the tool for comparing
// this implementation with another (HF transformers) on the same inputs.
// `trainctl-trainer forward --model DIR --request REQ.json --out OUT.safetensors [--device ..]
// [--dtype ..] [--attention ..]` calls it.
//
// The request is generate's (worker/trainer/tool_request.h): input_ids, attention_mask, and images
// (relative to the request's folder, through the project's image processor) or pixel_values_file,
// single <|image_pad|> tokens expanded to each image's count, the mask alongside. Unlike generate,
// forward runs the batch as given: after the expansion the rows must be equally long (pad them
// and mark the padding with attention_mask), and OUT holds `logits` [B, T, vocab] float32 for
// every position.
#ifndef TRAINCTL_WORKER_TRAINER_FORWARD_TOOL_H_
#define TRAINCTL_WORKER_TRAINER_FORWARD_TOOL_H_

#include <string>

#include "absl/status/status.h"
#include "worker/trainer/model/forward_tool.h"

namespace trainctl::trainer {

// Loads the model in `model_dir` (config.json + safetensors weights) in options.dtype on
// options.device, runs it in eval mode without autograd on the request at `request_path` and
// writes the logits to the safetensors file `out_path`. INVALID_ARGUMENT naming the field for a
// malformed request, or with the model's message for inputs it rejects (ids out of range, ...);
// NOT_FOUND for unreadable files; the loader's and the writer's errors otherwise.
absl::Status RunForward(const std::string& model_dir, const std::string& request_path,
                        const std::string& out_path, const model::ForwardOptions& options = {});

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_FORWARD_TOOL_H_
