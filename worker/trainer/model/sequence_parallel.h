// DeepSpeed-Ulysses sequence parallelism for the decoder (attention.h SequenceParallel): the
// embeddings (images included) are made whole on every rank of the group, each rank keeps its
// slice of the sequence through the decoder layers, attention trades heads for positions with one
// all-to-all before and one after (each rank attends over the whole sequence for 1/size of the
// heads), and the last hidden states are gathered whole again for the head and the loss.
//
// A sequence whose length is not a multiple of the group's size is padded at its end: causal
// attention keeps real positions from ever reading the padding, whose own outputs are dropped.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_SEQUENCE_PARALLEL_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_SEQUENCE_PARALLEL_H_

#include <torch/torch.h>

#include <cstdint>

#include "worker/trainer/model/attention.h"

namespace trainctl::model {

// The length `seq` padded up to a multiple of sp.size.
int64_t PaddedLength(int64_t seq, const SequenceParallel& sp);

// This rank's slice of `x` along `dim`, `x` padded (zeros, or the last position's values with
// `repeat_last`) to `padded` first.
torch::Tensor SliceSequence(const torch::Tensor& x, int64_t dim, int64_t padded,
                            const SequenceParallel& sp, bool repeat_last = false);

// The whole sequence from every rank's slice `chunk` ([B, L / size, ...], along dim 1), cut to
// `seq`. Differentiable: a slice's gradient is the sum of what every rank's loss sent it.
torch::Tensor GatherSequence(const torch::Tensor& chunk, int64_t seq, const SequenceParallel& sp);

// Causal attention of this rank's slices q [B, H, L / size, D], k and v [B, Hkv, L / size, D]
// (after the rotary embedding) over the whole sequence: heads scattered, positions gathered,
// attended, and back. H must divide by size; key/value heads that do not are repeated to H first.
// `allowed`: the key mask over the whole padded length, or undefined. Returns [B, H, L / size, D].
torch::Tensor UlyssesAttention(AttentionImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& allowed,
                               const SequenceParallel& sp);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_SEQUENCE_PARALLEL_H_
