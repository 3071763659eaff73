#include "worker/trainer/model/sequence_parallel.h"

namespace trainctl::model {

int64_t PaddedLength(int64_t seq, const SequenceParallel& sp) {
  return (seq + sp.size - 1) / sp.size * sp.size;
}

torch::Tensor SliceSequence(const torch::Tensor& x, int64_t dim, int64_t padded,
                            const SequenceParallel& sp, bool repeat_last) {
  const int64_t seq = x.size(dim);
  torch::Tensor whole = x;
  if (padded > seq) {
    const torch::Tensor tail =
        repeat_last ? x.narrow(dim, seq - 1, 1).expand_as(x.narrow(dim, 0, 1)).contiguous()
                    : torch::zeros_like(x.narrow(dim, 0, 1));
    std::vector<int64_t> reps(static_cast<size_t>(x.dim()), 1);
    reps[static_cast<size_t>(dim)] = padded - seq;
    whole = torch::cat({x, tail.repeat(reps)}, dim);
  }
  const int64_t length = padded / sp.size;
  return whole.narrow(dim, sp.rank * length, length);
}

torch::Tensor GatherSequence(const torch::Tensor& chunk, int64_t seq, const SequenceParallel& sp) {
  // Every rank sends its slice to every rank: the slice stacked `size` times, scattered along the
  // stack and gathered along the sequence. In backward the exchange runs the other way and the
  // stack's gradient sums what each rank's loss gave this slice.
  std::vector<int64_t> stacked = {sp.size};
  for (int64_t d : chunk.sizes()) stacked.push_back(d);
  const torch::Tensor copies = chunk.unsqueeze(0).expand(stacked).contiguous();
  const torch::Tensor whole = sp.all_to_all(copies, /*scatter_dim=*/0, /*gather_dim=*/2).squeeze(0);
  return whole.narrow(1, 0, seq);
}

torch::Tensor UlyssesAttention(AttentionImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& allowed,
                               const SequenceParallel& sp) {
  const int64_t heads = q.size(1);
  TORCH_CHECK(heads % sp.size == 0, "sequence parallelism: ", sp.size, " ranks do not divide ",
              heads, " attention heads");
  torch::Tensor keys = k, values = v;
  if (k.size(1) % sp.size != 0) {
    // Grouped key/value heads that cannot be split evenly: each query head's own copy.
    keys = k.repeat_interleave(heads / k.size(1), 1);
    values = v.repeat_interleave(heads / v.size(1), 1);
  }
  // [B, heads, L / size, D] -> [B, heads / size, L, D]: a contiguous block of query heads and the
  // matching block of key/value heads (GQA's grouping survives the split).
  const torch::Tensor q_all = sp.all_to_all(q.contiguous(), 1, 2);
  const torch::Tensor k_all = sp.all_to_all(keys.contiguous(), 1, 2);
  const torch::Tensor v_all = sp.all_to_all(values.contiguous(), 1, 2);
  const torch::Tensor out =
      DotProductAttention(impl, q_all, k_all, v_all, allowed, /*causal=*/true);
  return sp.all_to_all(out.contiguous(), 2, 1);
}

}  // namespace trainctl::model
