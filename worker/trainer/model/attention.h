// Scaled dot-product attention for the decoder and the vision tower, in two implementations:
// eager (matmul, masked softmax in float32, matmul; LibTorch 1.13 and CPUs) and fused
// (`scaled_dot_product_attention`, LibTorch >= 2.0: FlashAttention or memory-efficient kernels on
// CUDA). Both take the same inputs and agree within the compute dtype's rounding.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_ATTENTION_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_ATTENTION_H_

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"

namespace trainctl::model {

enum class AttentionImpl {
  kAuto,   // fused on CUDA tensors when this build has it, eager otherwise
  kEager,  // matmul + softmax, as HF's "eager"
  kSdpa,   // scaled_dot_product_attention, as HF's "sdpa"
};

// True when this build's LibTorch has scaled_dot_product_attention (2.0 and later).
bool FusedAttentionAvailable();

// "auto" | "eager" | "sdpa"; "sdpa" is refused (FAILED_PRECONDITION) by builds without it.
absl::StatusOr<AttentionImpl> ParseAttentionImpl(const std::string& name);
std::string AttentionImplName(AttentionImpl impl);

// kAuto resolved for tensors on `device`.
AttentionImpl ResolveAttentionImpl(AttentionImpl impl, const torch::Device& device);

// softmax(q k^T / sqrt(d) + mask) v. q [B, H, T, D]; k, v [B, Hkv, S, D] with H a multiple of Hkv
// (grouped-query attention: query head h reads key/value head h / (H / Hkv)). `allowed`, when
// defined, is bool [B, 1, T, S] (true where query t may read key s); when undefined, `causal`
// says whether query t reads keys 0..t (T == S) or every key. A query row with no allowed key (a
// padding position) gives an arbitrary finite output: callers ignore padding positions.
// Returns [B, H, T, D] in q's dtype.
torch::Tensor DotProductAttention(AttentionImpl impl, const torch::Tensor& q,
                                  const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& allowed, bool causal);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_ATTENTION_H_
