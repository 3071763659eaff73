// Megatron-style tensor parallelism for the decoder (issue 27): a group of `size` ranks shares
// each batch, rank `rank` holding rows [rank * I / size, (rank + 1) * I / size) of each MLP's
// gate_proj and up_proj (column parallel) and the same columns of down_proj (row parallel), I the
// intermediate size; with `attention`, likewise its share of each attention's heads: the rows of
// q_proj, k_proj and v_proj (and their biases) of query heads [rank * H / size, ...) and of the
// key/value heads they read, and the same heads' columns of o_proj. A block's input is whole on
// every rank of the group; each rank computes its part, and one all-reduce sums the parts:
//   forward:  x -> f -> gate/up (this rank's rows) -> SwiGLU -> down (its columns) -> g
//             x -> f -> q/k/v (its heads) -> rotary, attention -> o (its heads' columns) -> g
//   f: identity forward, all-reduce of the input's gradient in backward;
//   g: all-reduce forward, identity backward.
// Everything else (norms, the vision tower; attention without `attention`) is replicated over
// the group and computes the same values and gradients on each of its ranks.
//
// With `vocab_parallel`, the token embedding and the language-model head are split by vocabulary
// rows too (Megatron's VocabParallelEmbedding and vocab-parallel cross-entropy): a rank looks up
// the tokens in its rows and the group sums the lookups; the head computes the logits of its
// rows only, and the cross-entropy combines the group's log-sum-exps and target logits
// (internal/linear_cross_entropy.h) so the [tokens, vocab] logits never exist whole on a rank.
// Full logits (generation, GRPO's and distillation's log-probabilities) are gathered over the
// group.
//
// Weight names and checkpoints stay whole: a weight's slice is taken when the model is built or
// read (TensorParallelDim, SliceForTensorParallel) and the slices are joined again for
// checkpoints and export (JoinTensorParallel), so a checkpoint does not depend on the group size.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_TENSOR_PARALLEL_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_TENSOR_PARALLEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trainctl::model {

struct TensorParallel {
  int64_t size = 1;
  int64_t rank = 0;
  bool attention = true;        // the decoder's attention split by heads too
  bool vocab_parallel = false;  // the embedding and the head split by vocabulary rows too
  // In place, the sum of `x` over the group's ranks (no autograd). Called by every rank of the
  // group in the same order.
  std::function<void(torch::Tensor& x)> all_reduce;
  // The group's `x`s (equal shapes) concatenated along dim 0 in rank order (no autograd).
  std::function<torch::Tensor(const torch::Tensor& x)> all_gather;
};

// The dimension along which the weight `name` (the model's key, e.g.
// "model.layers.3.mlp.down_proj.weight") is split over the group: 0 for a decoder layer's
// gate_proj and up_proj, 1 for its down_proj; with attention 0 for its q_proj, k_proj and v_proj
// (weights and biases), 1 for its o_proj; with vocab_parallel 0 for model.embed_tokens and
// lm_head; -1 for every other weight (replicated).
int TensorParallelDim(const std::string& name, const TensorParallel& tp);

// This rank's slice of the whole weight `full` (a contiguous copy); `full` itself when the weight
// is replicated or the group has one rank. The split dimension must divide by the group's size.
torch::Tensor SliceForTensorParallel(const std::string& name, const torch::Tensor& full,
                                     const TensorParallel& tp);

// The whole weight from this rank's slice: every rank's slice gathered and joined along the
// weight's dimension (collective over the group); `slice` itself when it is replicated.
torch::Tensor JoinTensorParallel(const std::string& name, const torch::Tensor& slice,
                                 const TensorParallel& tp);

// The whole shape of a weight whose slice has `shape`.
std::vector<int64_t> WholeShape(const std::string& name, std::vector<int64_t> shape,
                                const TensorParallel& tp);

// f and g above, as autograd functions over the group.
torch::Tensor CopyToTensorParallel(const torch::Tensor& x, const TensorParallel& tp);
torch::Tensor ReduceFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp);

// vocab_parallel: the embeddings of `ids` from this rank's rows `weight` [V / size, H] (zeros for
// the ids outside them), summed over the group.
torch::Tensor VocabParallelEmbedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                     const TensorParallel& tp);
// vocab_parallel: the group's logits [..., V / size] joined along the last dim, in rank order;
// backward keeps this rank's columns of the gradient (every rank's loss is the same).
torch::Tensor GatherVocabParallel(const torch::Tensor& logits, const TensorParallel& tp);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_TENSOR_PARALLEL_H_
