// DeepSpeed-Ulysses' sequence all-to-all (its _SeqAllToAll), as an autograd function over a Comm
// (normally a sequence-parallel sub-group, Comm::Subgroup).
//
// Each rank holds its slice of the sequence and all heads; attention needs all of the sequence for
// a slice of the heads. SequenceAllToAll(comm, x, /*scatter_dim=*/heads, /*gather_dim=*/sequence)
// makes that switch, and the same call with the dims swapped switches back.
#ifndef TRAINCTL_WORKER_TRAINER_ZERO_SEQUENCE_ALL_TO_ALL_H_
#define TRAINCTL_WORKER_TRAINER_ZERO_SEQUENCE_ALL_TO_ALL_H_

#include <torch/torch.h>

#include <cstdint>

#include "worker/trainer/zero/comm.h"

namespace trainctl::zero {

// Splits `x` into comm.world_size() equal chunks along `scatter_dim`, sends chunk j to rank j,
// and returns the chunks received, concatenated along `gather_dim` in rank order: x [B, H, s, D]
// with scatter_dim 1 and gather_dim 2 gives [B, H/W, s*W, D], rank r holding heads
// [r*H/W, (r+1)*H/W) of the whole sequence (rank 0's part of it first). Negative dims count from
// the end. Backward is the same exchange with the dims swapped.
//
// Collective over `comm`, in forward and in backward: every rank of the group calls it with the
// same shapes, and every rank's output must reach its loss (an output without a gradient on one
// rank would leave the others waiting in backward). Waits for the exchange before returning (it is
// on the critical path). Throws c10::Error when x.size(scatter_dim) is not a multiple of the group
// size, CollectiveError when the exchange fails; `comm` must outlive the graph's backward.
// Any dtype; on Gloo, 16-bit floats travel as bytes.
torch::Tensor SequenceAllToAll(Comm& comm, const torch::Tensor& x, int64_t scatter_dim,
                               int64_t gather_dim);

}  // namespace trainctl::zero

#endif  // TRAINCTL_WORKER_TRAINER_ZERO_SEQUENCE_ALL_TO_ALL_H_
