// Cross-entropy of a linear head's logits, a chunk of rows at a time, so that the [rows, vocab]
// logits never exist whole: for 16k tokens and Qwen's 151,936-word vocabulary one fp32 copy is
// 10 GB, and the unfused loss keeps several (bf16 logits, their fp32 copy, log-probabilities,
// their gradient).
//
// With gradients wanted, they are computed during the forward, chunk by chunk, while each chunk's
// logits exist: the loss is a sum, so its gradient with respect to a row's logits is softmax minus
// the one-hot label, scaled in backward by the incoming gradient. The head's three matmuls (the
// logits, the input's and the weight's gradients) are each done once, as unfused; the weight's
// gradient accumulates over chunks in fp32. Under autocast the matmuls run in its dtype and the
// softmax in fp32, as `cross_entropy(linear(x, w).float(), labels)` does.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_LINEAR_CROSS_ENTROPY_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_LINEAR_CROSS_ENTROPY_H_

#include <torch/torch.h>

#include <cstdint>

#include "worker/trainer/model/tensor_parallel.h"

namespace trainctl::model::internal {

// Rows per chunk when chunk_rows is 0: about 2^27 logits (512 MiB in fp32) per chunk.
int64_t DefaultChunkRows(int64_t vocab);

// sum over rows r with labels[r] != ignore_index of -log softmax(x[r] @ weight^T)[labels[r]], a
// float32 scalar. x [N, H], weight [V, H], labels [N] int64. Gradients flow to x and weight.
torch::Tensor LinearCrossEntropySum(const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& labels, int64_t ignore_index = -100,
                                    int64_t chunk_rows = 0);

// As LinearCrossEntropySum with the head split by vocabulary rows over a tensor-parallel group
// (tensor_parallel.h, vocab_parallel): `weight` [V / size, H] is this rank's rows, labels are
// whole-vocabulary ids. Per chunk the group combines its log-sum-exps (gathered, one value per
// row and rank) and the target logits (summed: only the rank holding a label's row contributes
// it); each rank computes its columns' gradient (softmax minus one-hot), the input's gradient is
// summed over the group, the weight's stays this rank's. Returns the whole loss on every rank.
// Collective: every rank of the group calls it with the same x and labels.
torch::Tensor VocabParallelCrossEntropySum(const torch::Tensor& x, const torch::Tensor& weight,
                                           const torch::Tensor& labels, const TensorParallel& tp,
                                           int64_t ignore_index = -100, int64_t chunk_rows = 0);

}  // namespace trainctl::model::internal

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_LINEAR_CROSS_ENTROPY_H_
