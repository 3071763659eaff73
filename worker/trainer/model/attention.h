// Scaled dot-product attention for the decoder and the vision tower, in two implementations:
// eager (matmul, masked softmax in float32, matmul; LibTorch 1.13 and CPUs) and fused
// (`scaled_dot_product_attention`, LibTorch >= 2.0: FlashAttention or memory-efficient kernels on
// CUDA). Both take the same inputs and agree within the compute dtype's rounding.
//
// The eager path never builds more than the score budget's elements of scores at once: queries
// are taken in blocks of AttentionQueryChunk rows (every row's softmax is its own, so the result
// is the one-matrix result), and memory grows as T x block, not T x S per head. A 4000x4000 photo
// is 65,536 patches in the vision tower: one [16, 65536, 65536] float32 matrix is 256 GiB, a
// block of 32 rows 128 MiB.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_ATTENTION_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_ATTENTION_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

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

// Score elements (batch x heads x query rows x keys) one eager block may hold: 2^25 (128 MiB in
// float32) by default. Process-wide; tests and benches lower it to force blocks.
inline constexpr int64_t kDefaultAttentionScoreBudget = int64_t{1} << 25;
void SetAttentionScoreBudget(int64_t elements);
int64_t AttentionScoreBudget();
// Query rows per eager block for `batch_heads` (B x H) heads over `keys` keys: at least 1, at most
// `queries`.
int64_t AttentionQueryChunk(int64_t batch_heads, int64_t queries, int64_t keys);
// The largest score tensor (elements) the eager path has built since the last reset, for tests
// and benches that check the blocks.
int64_t LargestAttentionScores();
void ResetLargestAttentionScores();

// kAuto resolved for tensors on `device`.
AttentionImpl ResolveAttentionImpl(AttentionImpl impl, const torch::Device& device);

// softmax(q k^T / sqrt(d) + mask) v. q [B, H, T, D]; k, v [B, Hkv, S, D] with H a multiple of Hkv
// (grouped-query attention: query head h reads key/value head h / (H / Hkv)). `allowed`, when
// defined, is bool [B, 1, T, S] (true where query t may read key s), or a key mask [B, 1, 1, S]
// that `causal` then narrows: query t, the last T of S positions, reads the allowed keys up to
// S - T + t (a padded prefill's mask without its [T, S] matrix; a decoding step, T = 1, reads
// every allowed key). When `allowed` is undefined, `causal` says whether query t reads keys 0..t
// (T == S) or every key. A query row with no allowed key (a padding position) gives an arbitrary
// finite output: callers ignore padding positions.
// Returns [B, H, T, D] in q's dtype.
torch::Tensor DotProductAttention(AttentionImpl impl, const torch::Tensor& q,
                                  const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& allowed, bool causal);

// The samples of packed rows (padding-free packing): sample i holds positions
// [start[i], start[i] + length[i]) of row `row[i]`, in row then position order; positions no
// sample covers are padding.
struct PackedSamples {
  std::vector<int64_t> row;
  std::vector<int64_t> start;
  std::vector<int64_t> length;

  size_t size() const { return row.size(); }
  int64_t longest() const;
};

// The samples of `segment_ids` [B, T] (read on the host): each run of one non-zero id.
PackedSamples PackedSamplesOf(const torch::Tensor& segment_ids);

// Causal attention inside each sample of packed rows, never across them (FlashAttention's
// variable-length form, cu_seqlens): every sample is attended on its own, so the cost is
// sum(length^2) per head, not T^2, and no [T, T] mask exists. q [B, H, T, D]; k, v [B, Hkv, T, D].
// Padding positions come out as zeros. Returns [B, H, T, D] in q's dtype.
torch::Tensor PackedCausalAttention(AttentionImpl impl, const torch::Tensor& q,
                                    const torch::Tensor& k, const torch::Tensor& v,
                                    const PackedSamples& samples);

// DeepSpeed-Ulysses sequence parallelism (sequence_parallel.h): a group of `size` ranks shares
// each batch, rank `rank` holding positions [rank * L / size, (rank + 1) * L / size) of the
// (padded) length L between the attention layers.
struct SequenceParallel {
  int64_t size = 1;
  int64_t rank = 0;
  // Splits x into `size` equal chunks along scatter_dim, chunk j to rank j, and concatenates the
  // chunks that arrive (rank order) along gather_dim; differentiable (its backward is the same
  // exchange with the dims swapped). Called by every rank of the group in the same order.
  std::function<torch::Tensor(const torch::Tensor& x, int64_t scatter_dim, int64_t gather_dim)>
      all_to_all;
};

// What a decoder layer's queries may read: `allowed` as DotProductAttention takes it, or with
// `packed` set the samples of packed rows (PackedCausalAttention; `allowed` is then unused). With
// `sequence` set, q, k and v are this rank's slice of the sequence and `allowed` covers the
// whole padded length: attention exchanges heads for positions over the group
// (UlyssesAttention).
struct AttentionMask {
  torch::Tensor allowed;
  std::shared_ptr<const PackedSamples> packed;
  std::shared_ptr<const SequenceParallel> sequence;
};

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_ATTENTION_H_
