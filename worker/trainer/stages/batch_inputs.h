// A data::Batch (plain arrays from the loader) as the model's input tensors on a device.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_BATCH_INPUTS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_BATCH_INPUTS_H_

#include <torch/torch.h>

#include "common/data/batch.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::trainer {

// The batch as model inputs: pixel values on `device`, the integer tensors (int64) on the host,
// where the model reads them without synchronising with the device and from where it copies them
// over itself. `batch` need not outlive the result.
model::ModelInputs ToModelInputs(const data::Batch& batch, const torch::Device& device);

// Labels for next-token prediction on `device`, [batch, seq_len - 1] int64: position i predicts
// token i + 1.
torch::Tensor ShiftedLabels(const data::Batch& batch, const torch::Device& device);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_BATCH_INPUTS_H_
