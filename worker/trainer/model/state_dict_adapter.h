// HF checkpoints <-> Qwen2VLForConditionalGeneration: loads `model.safetensors` (or the shards of
// `model.safetensors.index.json`) in either key layout, and saves in HF's layout so transformers
// loads the result.
//
// Key layouts: the published one (`model.layers.*`, `visual.*`, `lm_head.*`) is the model's own;
// newer transformers write `model.language_model.*` and `model.visual.*`, mapped here onto it.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_STATE_DICT_ADAPTER_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_STATE_DICT_ADAPTER_H_

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"

namespace trainctl::model {

// The model's parameter name for a checkpoint key of either layout.
std::string ToModelKey(const std::string& checkpoint_key);

// Copies every parameter of `model` from the checkpoint at `path` (a directory, a .safetensors
// file or an index; see SafetensorsCheckpoint::Open), converting to each parameter's dtype and
// device. Nothing is copied unless the whole checkpoint matches:
//   NOT_FOUND naming tensor and file for a parameter the checkpoint lacks (lm_head.weight may be
//     absent only when tie_word_embeddings);
//   INVALID_ARGUMENT naming tensor and file for a key that is no parameter of the model (a tied
//     lm_head.weight and rotary inv_freq buffers are ignored), a key present in both layouts, or
//     a shape that differs from the parameter's;
//   the reader's errors (DATA_LOSS for a truncated or corrupt file, naming tensor and file).
absl::Status LoadHfCheckpoint(Qwen2VLForConditionalGeneration& model, const std::string& path);

struct SaveOptions {
  std::optional<torch::ScalarType> dtype;  // e.g. kBFloat16; default: each parameter's own
  ShardingOptions sharding;
};

// Writes `config.json` and the weights (`model.safetensors`, or shards + index) into `dir`, HF's
// layout; a tied lm_head is left out as transformers does. Errors as WriteSafetensorsCheckpoint.
absl::Status SaveHfCheckpoint(const Qwen2VLForConditionalGeneration& model, const std::string& dir,
                              const SaveOptions& options = {});

// As SaveHfCheckpoint, for weights held outside a model (a sharded engine's gathered weights):
// `tensors` carry the model's parameter names.
absl::Status SaveHfTensors(const Qwen2VLConfig& config, std::vector<NamedTensor> tensors,
                           const std::string& dir, const SaveOptions& options = {});

// Builds the model described by `dir`/config.json in `dtype` and loads its weights.
absl::StatusOr<std::shared_ptr<Qwen2VLForConditionalGeneration>> LoadHfModel(
    const std::string& dir, torch::ScalarType dtype = torch::kFloat32);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_STATE_DICT_ADAPTER_H_
