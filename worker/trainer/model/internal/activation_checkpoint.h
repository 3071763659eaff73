// Activation checkpointing for one unit of the model (a decoder layer, a vision block): the
// forward keeps only the unit's input; backward re-runs the unit with autograd on and
// backpropagates through the recomputation.
//
// Built as a custom autograd Function (LibTorch 1.13 and 2.x alike) whose inputs are the unit's
// input and its parameters, so parameter gradients flow out of the recorded node like any other
// gradient (hooks on parameters fire as usual) rather than being accumulated from inside it.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_ACTIVATION_CHECKPOINT_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_ACTIVATION_CHECKPOINT_H_

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace trainctl::model::internal {

using UnitFn = std::function<torch::Tensor(const torch::Tensor&)>;

// Returns fn(input), recording it for recomputation in backward. `params` are the tensors `fn`
// reads that may need gradients (the unit's parameters). `fn` must be deterministic and must not
// modify its input; it is called again, under the autocast state of this call, during backward.
// With grad mode off, or when neither input nor params require grad, it is just fn(input).
torch::Tensor CheckpointedCall(const UnitFn& fn, const torch::Tensor& input,
                               const std::vector<torch::Tensor>& params);

}  // namespace trainctl::model::internal

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_ACTIVATION_CHECKPOINT_H_
