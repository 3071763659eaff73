// Drawing the next token of each row from its logits, as Generate samples: the logits in float32,
// divided by the temperature, then HF's top-k and top-p filters in that order, softmax, and one
// draw per row by inverse transform: with u uniform in [0, 1) from the row's generator, the token
// is the first (in id order) whose cumulative kept probability exceeds u times the kept total.
//
// Two implementations of that one definition. On a CUDA (or any non-CPU) device the vocabulary-
// wide passes stay on the device as tensor ops (a sort for top-p, a float64 cumulative sum and
// searchsorted), so the host reads B ids per step. On the CPU that path cost more than a tiny
// model's decoding step (a float64 copy and a sequential cumulative sum over 151,936 entries per
// row, a full sort per row for top-p), so rows are drawn in parallel, each from its softmax by
// block sums (float64) and a scan inside the one block that holds the target, and the filters find
// their cut without sorting the vocabulary (a running threshold for top-k, a radix selection over
// the logits' bits for top-p). The two agree on every
// draw except where u lands within rounding (~1e-7 of the mass) of a token's boundary.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_SAMPLING_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_SAMPLING_H_

#include <torch/torch.h>

#include <cstdint>

namespace trainctl::model::internal {

struct SamplingFilters {
  double temperature = 1.0;  // > 0; 1 divides nothing
  // 0 or >= vocab: off. Else the tokens whose logit is below the k-th largest get probability 0
  // (ties with the k-th all stay, as HF's TopKLogitsWarper).
  int64_t top_k = 0;
  // In (0, 1]; 1: off. Else, after top-k, the smallest set of most likely tokens whose mass
  // reaches top_p stays (the most likely token always does; ties at the cut in id order).
  double top_p = 1.0;
};

// The CPU path's [B, vocab] float32 temporaries, kept from one call to the next: a fresh 10 MB
// buffer per step costs its page faults (on this project's VMs, more than the passes over it).
// Not thread-safe; one per caller.
struct CpuSamplingBuffers {
  torch::Tensor scaled;  // logits / temperature
  torch::Tensor probs;   // their softmax
};

// One token per row, [B] int64 on the CPU, from `logits` [B, vocab] (any floating dtype, any
// device) and `uniforms` [B] float64 on the CPU, each in [0, 1). CPU logits are drawn by
// SampleTokensOnCpu (with `buffers` when given), others by SampleTokensOnDevice. Throws
// c10::Error on other shapes.
torch::Tensor SampleTokens(const torch::Tensor& logits, const SamplingFilters& filters,
                           const torch::Tensor& uniforms, CpuSamplingBuffers* buffers = nullptr);

// The tensor-op path on the logits' device (also the reference the CPU path is tested against).
torch::Tensor SampleTokensOnDevice(const torch::Tensor& logits, const SamplingFilters& filters,
                                   const torch::Tensor& uniforms);

// The CPU path: rows in parallel (at::parallel_for); per row, after the softmax, one pass over
// the vocabulary for the block sums; top-k adds one pass (a running threshold keeps a short list
// of candidates, and the draw then runs over the kept tokens only), top-p alone three.
torch::Tensor SampleTokensOnCpu(const torch::Tensor& logits, const SamplingFilters& filters,
                                const torch::Tensor& uniforms,
                                CpuSamplingBuffers* buffers = nullptr);

}  // namespace trainctl::model::internal

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_INTERNAL_SAMPLING_H_
