#include "worker/trainer/model/attention.h"

#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

#if TORCH_VERSION_MAJOR >= 2
#define TRAINCTL_HAVE_SDPA 1
#endif
// enable_gqa (key/value heads shared by query groups inside the kernel) arrived in 2.5.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define TRAINCTL_HAVE_SDPA_GQA 1
#endif

namespace trainctl::model {
namespace {

double LowestValue(torch::ScalarType dtype) {
  double lowest = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kHalf, torch::kBFloat16, dtype, "LowestValue", [&] {
    lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
  });
  return lowest;
}

// [B, Hkv, S, D] -> [B, Hkv * groups, S, D], each key/value head repeated for its query group.
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, groups, s, d}).reshape({b, h * groups, s, d});
}

// Query rows [start, start + rows) of the causal mask over `s` keys: key j is allowed for query i
// when j <= i.
torch::Tensor CausalAllowedRows(int64_t start, int64_t rows, int64_t s,
                                const torch::Device& device) {
  const auto opts = torch::TensorOptions().device(device);
  return (torch::arange(s, opts).unsqueeze(0) <=
          torch::arange(start, start + rows, opts).unsqueeze(1))
      .view({1, 1, rows, s});
}

std::atomic<int64_t> score_budget{kDefaultAttentionScoreBudget};
std::atomic<int64_t> largest_scores{0};

// softmax(q k^T / sqrt(d) + mask) v for one block of query rows; `mask` is bool [B, 1, rows, S]
// or undefined (every key).
torch::Tensor EagerRows(const torch::Tensor& q, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& mask) {
  torch::Tensor scores =
      torch::matmul(q, keys.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  int64_t seen = largest_scores.load(std::memory_order_relaxed);
  while (scores.numel() > seen && !largest_scores.compare_exchange_weak(seen, scores.numel())) {
  }
  if (mask.defined()) {
    // The dtype's lowest value rather than -inf: a fully masked row (a padding query) then gets
    // a uniform distribution instead of NaN, as in HF.
    scores = scores.masked_fill(mask.logical_not(), LowestValue(scores.scalar_type()));
  }
  const torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return torch::matmul(probs, values);
}

// Each query row's softmax reads only that row's scores, so the rows are taken in blocks sized to
// the score budget and concatenated: the same values as one [B, H, T, S] matrix, without it.
torch::Tensor EagerAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& allowed, bool causal) {
  const int64_t groups = q.size(1) / k.size(1);
  const torch::Tensor keys = RepeatKv(k, groups);
  const torch::Tensor values = RepeatKv(v, groups);
  const int64_t t = q.size(2), s = k.size(2);
  const int64_t rows = AttentionQueryChunk(q.size(0) * q.size(1), t, s);
  auto mask_rows = [&](int64_t start, int64_t n) -> torch::Tensor {
    if (!allowed.defined()) return causal ? CausalAllowedRows(start, n, s, q.device()) : allowed;
    if (allowed.size(2) != 1) return allowed.narrow(2, start, n);
    // A key mask: with `causal`, query t (the last T of S positions) reads keys up to S - T + t.
    return causal ? allowed.logical_and(CausalAllowedRows(start + s - t, n, s, q.device()))
                  : allowed;
  };
  if (rows >= t) return EagerRows(q, keys, values, mask_rows(0, t));
  std::vector<torch::Tensor> outs;
  outs.reserve(static_cast<size_t>((t + rows - 1) / rows));
  for (int64_t start = 0; start < t; start += rows) {
    const int64_t n = std::min(rows, t - start);
    outs.push_back(EagerRows(q.narrow(2, start, n), keys, values, mask_rows(start, n)));
  }
  return torch::cat(outs, 2);
}

#ifdef TRAINCTL_HAVE_SDPA
torch::Tensor FusedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& allowed, bool causal) {
  const int64_t groups = q.size(1) / k.size(1);
#ifdef TRAINCTL_HAVE_SDPA_GQA
  const bool gqa = groups > 1;
  const torch::Tensor& keys = k;
  const torch::Tensor& values = v;
#else
  const bool gqa = false;
  const torch::Tensor keys = RepeatKv(k, groups);
  const torch::Tensor values = RepeatKv(v, groups);
#endif
  if (!allowed.defined()) {
    // No mask: the FlashAttention kernel takes this (causal or not) directly.
    return at::scaled_dot_product_attention(q, keys, values, {}, 0.0, causal, {}, gqa);
  }
  // A query with no allowed key would give NaN in the fused kernels; letting such a row read its
  // own position keeps it finite without touching any other row.
  const int64_t t = q.size(2), s = k.size(2);
  torch::Tensor mask = allowed;
  if (causal && mask.size(2) == 1) {
    // A key mask with causal: the kernels take one mask, so the two are combined here.
    mask = mask.logical_and(CausalAllowedRows(s - t, t, s, q.device()));
  }
  if (t == s) {
    mask =
        mask.logical_or(torch::eye(t, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                            .view({1, 1, t, s}));
  }
  return at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, {}, gqa);
}
#endif

}  // namespace

bool FusedAttentionAvailable() {
#ifdef TRAINCTL_HAVE_SDPA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<AttentionImpl> ParseAttentionImpl(const std::string& name) {
  if (name == "auto") return AttentionImpl::kAuto;
  if (name == "eager") return AttentionImpl::kEager;
  if (name == "sdpa") {
    if (!FusedAttentionAvailable()) {
      return absl::FailedPreconditionError(
          absl::StrCat("attention 'sdpa' needs LibTorch >= 2.0; this build has ",
                       TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, " (use 'eager' or 'auto')"));
    }
    return AttentionImpl::kSdpa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("attention: expected auto, eager or sdpa, got '", name, "'"));
}

std::string AttentionImplName(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kAuto:
      return "auto";
    case AttentionImpl::kEager:
      return "eager";
    case AttentionImpl::kSdpa:
      return "sdpa";
  }
  return "unknown";
}

void SetAttentionScoreBudget(int64_t elements) {
  score_budget.store(std::max<int64_t>(1, elements), std::memory_order_relaxed);
}

int64_t AttentionScoreBudget() { return score_budget.load(std::memory_order_relaxed); }

int64_t AttentionQueryChunk(int64_t batch_heads, int64_t queries, int64_t keys) {
  const int64_t per_row = std::max<int64_t>(1, batch_heads * keys);
  return std::clamp<int64_t>(AttentionScoreBudget() / per_row, 1, std::max<int64_t>(1, queries));
}

int64_t LargestAttentionScores() { return largest_scores.load(std::memory_order_relaxed); }

void ResetLargestAttentionScores() { largest_scores.store(0, std::memory_order_relaxed); }

AttentionImpl ResolveAttentionImpl(AttentionImpl impl, const torch::Device& device) {
  if (impl != AttentionImpl::kAuto) return impl;
  return FusedAttentionAvailable() && device.is_cuda() ? AttentionImpl::kSdpa
                                                       : AttentionImpl::kEager;
}

torch::Tensor DotProductAttention(AttentionImpl impl, const torch::Tensor& q,
                                  const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& allowed, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(1) % k.size(1) == 0,
              "attention: q [B, H, T, D] and k, v [B, Hkv, S, D] with H % Hkv == 0, got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
#ifdef TRAINCTL_HAVE_SDPA
  if (ResolveAttentionImpl(impl, q.device()) == AttentionImpl::kSdpa) {
    return FusedAttention(q, k, v, allowed, causal);
  }
#else
  TORCH_CHECK(impl != AttentionImpl::kSdpa, "attention 'sdpa' is not in this build");
#endif
  return EagerAttention(q, k, v, allowed, causal);
}

int64_t PackedSamples::longest() const {
  return length.empty() ? 0 : *std::max_element(length.begin(), length.end());
}

PackedSamples PackedSamplesOf(const torch::Tensor& segment_ids) {
  TORCH_CHECK(segment_ids.dim() == 2, "segment_ids must be [batch, seq], got ",
              segment_ids.sizes());
  const torch::Tensor seg = segment_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const auto s = seg.accessor<int64_t, 2>();
  PackedSamples out;
  for (int64_t b = 0; b < seg.size(0); ++b) {
    for (int64_t j = 0; j < seg.size(1);) {
      int64_t end = j + 1;
      while (end < seg.size(1) && s[b][end] == s[b][j]) ++end;
      if (s[b][j] != 0) {
        out.row.push_back(b);
        out.start.push_back(j);
        out.length.push_back(end - j);
      }
      j = end;
    }
  }
  return out;
}

torch::Tensor PackedCausalAttention(AttentionImpl impl, const torch::Tensor& q,
                                    const torch::Tensor& k, const torch::Tensor& v,
                                    const PackedSamples& samples) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == k.size(2),
              "packed attention: q [B, H, T, D] and k, v [B, Hkv, T, D], got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
  const int64_t batch = q.size(0), t = q.size(2);
  auto padding = [&q](int64_t n) {
    return torch::zeros({1, q.size(1), n, q.size(3)}, q.options());
  };
  // Rows and samples are cut with one split each, not a narrow per sample: the backward of a
  // split is one cat of the pieces' gradients, while each narrow's backward would write a
  // zero-filled gradient of the whole tensor (hundreds per layer for a row of short samples).
  const std::vector<torch::Tensor> q_rows = q.split(1, 0), k_rows = k.split(1, 0),
                                   v_rows = v.split(1, 0);
  // Each row is its samples' outputs and its padding's zeros, in position order.
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(batch));
  size_t i = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> sizes;  // along T: padding gaps and samples, covering [0, t)
    std::vector<bool> is_sample;
    int64_t at = 0;
    for (; i < samples.size() && samples.row[i] == b; ++i) {
      const int64_t start = samples.start[i], n = samples.length[i];
      TORCH_CHECK(start >= at && start + n <= t, "packed attention: sample ", i, " of row ", b,
                  " at [", start, ", ", start + n, ") overlaps another or leaves the row");
      if (start > at) {
        sizes.push_back(start - at);
        is_sample.push_back(false);
      }
      sizes.push_back(n);
      is_sample.push_back(true);
      at = start + n;
    }
    if (at < t) {
      sizes.push_back(t - at);
      is_sample.push_back(false);
    }
    const auto bq = static_cast<size_t>(b);
    const std::vector<torch::Tensor> qs = q_rows[bq].split_with_sizes(sizes, 2),
                                     ks = k_rows[bq].split_with_sizes(sizes, 2),
                                     vs = v_rows[bq].split_with_sizes(sizes, 2);
    std::vector<torch::Tensor> pieces;
    pieces.reserve(sizes.size());
    for (size_t j = 0; j < sizes.size(); ++j) {
      pieces.push_back(is_sample[j]
                           ? DotProductAttention(impl, qs[j], ks[j], vs[j], {}, /*causal=*/true)
                           : padding(sizes[j]));
    }
    rows.push_back(pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 2));
  }
  TORCH_CHECK(i == samples.size(), "packed attention: samples out of row order or past row ",
              batch - 1);
  return batch == 1 ? rows[0] : torch::cat(rows, 0);
}

}  // namespace trainctl::model
