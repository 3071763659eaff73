// The decoder's element-wise hot paths as single ops: RMSNorm, rotary embedding of q and k, and
// SwiGLU. On CUDA tensors of a build with the fused kernels (cuda/fused_kernels.h, the CUDA build
// with nvcc) each is one kernel forward and one backward, through a torch::autograd::Function;
// elsewhere, and for what the kernels do not take (listed per op), LibTorch's composite ops as HF
// writes them, which are also the reference the tests hold the kernels to. Both give HF's
// numerics: the same values, rounded to the storage dtype at the same points (cuda/fused_math.h).
//
// The fused backward is not itself differentiable (no double backward).
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_FUSED_OPS_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_FUSED_OPS_H_

#include <torch/torch.h>

#include <utility>

#include "worker/trainer/model/cuda/fused_kernels.h"

namespace trainctl::model {

// weight * (x.float() * rsqrt(mean(x.float()^2, -1) + eps)).to(x.dtype), x [..., dim], weight
// [dim]. Fused when x and weight share a dtype (float32, bfloat16 or float16), both are
// contiguous and dim <= fused::kRmsNormMaxDim.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin} with q [B, Hq, T, D], k
// [B, Hk, T, D] and cos, sin [B, T, D] (RotaryTables), broadcast over heads. Fused when q and k
// share a dtype, cos and sin have that dtype or float32 (the result is then float32, as LibTorch
// promotes), the last dimensions are contiguous (q and k may be the transposed views the
// projections make; the results keep their layout) and cos and sin need no gradient.
std::pair<torch::Tensor, torch::Tensor> ApplyRotary(const torch::Tensor& q, const torch::Tensor& k,
                                                    const torch::Tensor& cos,
                                                    const torch::Tensor& sin);

// silu(gate) * up. Fused when both are contiguous, of one shape and one dtype.
torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up);

// The composite forms, always: the reference in tests, and what the ops above fall back to.
torch::Tensor RmsNormComposite(const torch::Tensor& x, const torch::Tensor& weight, double eps);
std::pair<torch::Tensor, torch::Tensor> ApplyRotaryComposite(const torch::Tensor& q,
                                                             const torch::Tensor& k,
                                                             const torch::Tensor& cos,
                                                             const torch::Tensor& sin);
torch::Tensor SwiGluComposite(const torch::Tensor& gate, const torch::Tensor& up);

// Whether this build has the CUDA kernels (a CUDA build with nvcc).
bool FusedKernelsBuilt();
// The process-wide switch, on by default: off, every op runs its composite form (to compare, or
// to rule the kernels out). Read at each call, so it takes effect for the next forward; a backward
// always runs the same way as its forward did. Thread-safe. trainctl-trainer sets it from
// TRAINCTL_FUSED_KERNELS=0 at start-up.
void SetFusedKernelsEnabled(bool enabled);
bool FusedKernelsEnabled();

namespace internal {

// The kernels' entry points, as fused_kernels.h declares them.
struct FusedKernelTable {
  int (*rms_norm_forward)(const fused::RmsNormForwardArgs&, void* stream);
  int (*rms_norm_backward)(const fused::RmsNormBackwardArgs&, void* stream);
  int64_t (*rms_norm_backward_parts)(int64_t rows, int64_t dim);
  int (*rotary)(const fused::RotaryArgs&, void* stream);
  int (*swiglu_forward)(const fused::SwiGluArgs&, void* stream);
  int (*swiglu_backward)(const fused::SwiGluArgs&, void* stream);
  const char* (*status_string)(int status);
};

// Tests: kernels for CPU tensors (the host-compiled fused_math.h, tests/model/fused_host_kernels.h)
// so that the autograd Functions run, and are checked, without a GPU; nullptr (the default): CPU
// tensors take the composite forms. The table must outlive every op that used it, backward
// included.
void SetHostKernelsForTesting(const FusedKernelTable* table);

}  // namespace internal
}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_FUSED_OPS_H_
