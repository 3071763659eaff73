#include "worker/trainer/model/internal/sampling.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

namespace trainctl::model::internal {
namespace {

constexpr int64_t kBlock = 256;  // tokens per block sum of the CPU draw

void CheckShapes(const torch::Tensor& logits, const torch::Tensor& uniforms) {
  TORCH_CHECK(logits.defined() && logits.dim() == 2 && logits.size(1) > 0,
              "sampling: logits must be [batch, vocab]");
  TORCH_CHECK(uniforms.defined() && uniforms.dim() == 1 && uniforms.size(0) == logits.size(0),
              "sampling: one uniform number per row");
}

// The float's bits as an unsigned key in the float's order (-inf lowest; -0 is +0, as for `<`).
// Branch-free: a branch on the sign costs a misprediction on every other logit.
inline uint32_t OrderKey(float f) {
  f += 0.0f;  // -0 + 0 = +0
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

// The tokens a filter keeps: keys above `key`, and the ones equal to it up to id `last_tie`
// (the default keeps every token).
struct Cut {
  uint32_t key = 0;
  int64_t last_tie = std::numeric_limits<int64_t>::max();
};

// Per-thread buffers of the CPU path.
struct Scratch {
  std::array<double, 4096> hist;
  std::vector<int64_t> candidates;
  std::vector<double> blocks;
  std::vector<float> values;
};

// From the highest bin down, the first whose weight brings `*above` (the weight of the bins
// above it, updated) to `goal`; when rounding keeps the sum short, the lowest bin with weight.
// -1 when no bin has any.
int Walk(const double* hist, int bins, double goal, double* above) {
  int last = -1;
  double before_last = *above;
  for (int b = bins - 1; b >= 0; --b) {
    if (hist[b] <= 0) continue;
    if (*above + hist[b] >= goal) return b;
    last = b;
    before_last = *above;
    *above += hist[b];
  }
  *above = before_last;
  return last;
}

// The key at which the weights of the row's tokens, taken from the largest logit down, first sum
// to goal(total of all weights), by a radix selection over the keys' bits (12, 12, then 8): one
// pass over the row for the first histogram, one to collect the tokens of the chosen bin; the
// rest runs over those. Also the weight above that key and, in `s.candidates`, the ids (in
// order) of the tokens with that key. False when every weight is 0.
template <typename Weight, typename Goal>
bool SelectKey(const float* x, int64_t n, Weight weight, Goal goal_of_total, Scratch& s,
               uint32_t* key, double* above, double* goal) {
  s.hist.fill(0);
  for (int64_t i = 0; i < n; ++i) s.hist[OrderKey(x[i]) >> 20] += weight(i);
  double total = 0;
  for (double h : s.hist) total += h;
  *goal = goal_of_total(total);
  *above = 0;
  const int top = Walk(s.hist.data(), 4096, *goal, above);
  if (top < 0) return false;
  s.hist.fill(0);
  s.candidates.clear();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k = OrderKey(x[i]);
    if ((k >> 20) != static_cast<uint32_t>(top)) continue;
    s.candidates.push_back(i);
    s.hist[(k >> 8) & 0xfff] += weight(i);
  }
  const int mid = Walk(s.hist.data(), 4096, *goal, above);
  if (mid < 0) return false;
  const uint32_t high = (static_cast<uint32_t>(top) << 12) | static_cast<uint32_t>(mid);
  std::fill(s.hist.begin(), s.hist.begin() + 256, 0.0);
  size_t kept = 0;
  for (int64_t i : s.candidates) {
    const uint32_t k = OrderKey(x[i]);
    if ((k >> 8) != high) continue;
    s.candidates[kept++] = i;
    s.hist[k & 0xff] += weight(i);
  }
  s.candidates.resize(kept);
  const int low = Walk(s.hist.data(), 256, *goal, above);
  if (low < 0) return false;
  *key = (high << 8) | static_cast<uint32_t>(low);
  kept = 0;
  for (int64_t i : s.candidates) {
    if (OrderKey(x[i]) == *key) s.candidates[kept++] = i;
  }
  s.candidates.resize(kept);
  return true;
}

// The k-th largest of the logits at `ids`, by nth_element on a copy.
float KthLargest(const float* x, const std::vector<int64_t>& ids, int64_t k,
                 std::vector<float>& values) {
  values.clear();
  for (int64_t i : ids) values.push_back(x[i]);
  const auto kth = values.begin() + (k - 1);
  std::nth_element(values.begin(), kth, values.end(), std::greater<float>());
  return *kth;
}

// Top-k: the ids (ascending) of every token at least as large as the k-th largest logit. One pass
// over the row: a token joins the list when it is at least the running threshold, the k-th
// largest of the list, raised (and the list cut to the tokens at least as large) whenever the
// list fills its room (2k or more); a token it turns away is below k listed ones, so below the
// final k-th largest, and ties with the k-th are never turned away.
void TopK(const float* x, int64_t n, int64_t k, Scratch& s, std::vector<int64_t>& kept) {
  kept.clear();
  size_t room = static_cast<size_t>(std::max<int64_t>(2 * k, 1024));
  float threshold = -std::numeric_limits<float>::infinity();
  const auto raise = [&] {
    threshold = KthLargest(x, kept, k, s.values);
    size_t j = 0;
    for (int64_t i : kept) {
      if (x[i] >= threshold) kept[j++] = i;
    }
    kept.resize(j);
    if (kept.size() * 2 > room) room *= 2;  // many ties with the k-th: more room
  };
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] >= threshold)) continue;
    kept.push_back(i);
    if (kept.size() >= room) raise();
  }
  if (static_cast<int64_t>(kept.size()) > k) raise();
}

// Top-p over the listed tokens (ids ascending): the smallest most-likely set whose probability
// reaches top_p of theirs, ties in id order; the list keeps those, ids ascending.
void TopPOfList(const float* x, const float* p, double top_p, std::vector<int64_t>& kept,
                Scratch& s) {
  std::vector<int64_t>& order = s.candidates;
  order = kept;
  std::stable_sort(order.begin(), order.end(), [x](int64_t a, int64_t b) { return x[a] > x[b]; });
  double total = 0;
  for (int64_t i : kept) total += p[i];
  const double goal = top_p * total;
  double mass = 0;
  size_t count = order.size();
  for (size_t j = 0; j < order.size(); ++j) {
    mass += p[order[j]];
    if (mass >= goal) {
      count = j + 1;
      break;
    }
  }
  order.resize(count);
  std::sort(order.begin(), order.end());
  kept = order;
}

// The draw over the listed tokens (ids ascending): the first whose cumulative probability
// exceeds u times theirs.
int64_t DrawFromList(const float* p, const std::vector<int64_t>& kept, double u) {
  double total = 0;
  for (int64_t i : kept) total += p[i];
  const double target = u * total;
  double running = 0;
  int64_t last = kept.front();
  for (int64_t i : kept) {
    if (p[i] <= 0) continue;
    running += p[i];
    last = i;
    if (running > target) return i;
  }
  return last;  // u * total rounded up to total
}

// Top-p over the whole row: the smallest most-likely set whose probability reaches top_p, ties
// at the cut in id order.
Cut TopPCut(const float* x, const float* p, int64_t n, double top_p, Scratch& s) {
  const auto mass = [p](int64_t i) -> double { return p[i]; };
  const auto share = [top_p](double total) { return top_p * total; };
  Cut cut;
  double above = 0, goal = 0;
  if (!SelectKey(x, n, mass, share, s, &cut.key, &above, &goal)) return cut;
  cut.last_tie = s.candidates.back();
  for (int64_t i : s.candidates) {
    above += p[i];
    if (above >= goal) {
      cut.last_tie = i;
      break;
    }
  }
  return cut;
}

double BlockSum(const float* p, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return (s0 + s1) + (s2 + s3);
}

// Sets the probability of every token `cut` drops to 0, without a branch per token (which
// would be mispredicted at random where kept and dropped tokens interleave).
void ZeroOutside(const float* x, float* p, int64_t n, const Cut& cut) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k = OrderKey(x[i]);
    const uint32_t keep = (k > cut.key) | ((k == cut.key) & (i <= cut.last_tie));
    uint32_t bits;
    std::memcpy(&bits, &p[i], sizeof(bits));
    bits &= 0u - keep;
    std::memcpy(&p[i], &bits, sizeof(bits));
  }
}

// The first token whose cumulative probability exceeds u times the row's total: block sums in
// float64, then a scan of the one block where the running sum passes the target.
int64_t Draw(const float* p, int64_t n, double u, std::vector<double>& blocks) {
  const int64_t count = (n + kBlock - 1) / kBlock;
  blocks.resize(static_cast<size_t>(count));
  double total = 0;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t lo = b * kBlock;
    blocks[static_cast<size_t>(b)] = BlockSum(p + lo, std::min(n, lo + kBlock) - lo);
    total += blocks[static_cast<size_t>(b)];
  }
  const double target = u * total;
  double running = 0;
  for (int64_t b = 0; b < count; ++b) {
    const double sum = blocks[static_cast<size_t>(b)];
    if (running + sum <= target) {
      running += sum;
      continue;
    }
    const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    int64_t last = lo;
    for (int64_t i = lo; i < hi; ++i) {
      if (p[i] <= 0) continue;
      running += p[i];
      last = i;
      if (running > target) return i;
    }
    return last;  // the block's sum and its scan rounded apart
  }
  // u * total rounded up to total: the last token with probability.
  for (int64_t i = n - 1; i > 0; --i) {
    if (p[i] > 0) return i;
  }
  return 0;
}

}  // namespace

torch::Tensor SampleTokens(const torch::Tensor& logits, const SamplingFilters& filters,
                           const torch::Tensor& uniforms, CpuSamplingBuffers* buffers) {
  return logits.device().is_cpu() ? SampleTokensOnCpu(logits, filters, uniforms, buffers)
                                  : SampleTokensOnDevice(logits, filters, uniforms);
}

torch::Tensor SampleTokensOnDevice(const torch::Tensor& logits, const SamplingFilters& filters,
                                   const torch::Tensor& uniforms) {
  CheckShapes(logits, uniforms);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  torch::Tensor x = logits.to(torch::kFloat32);
  if (filters.temperature != 1) x = x / filters.temperature;
  const int64_t vocab = x.size(-1);
  if (filters.top_k > 0 && filters.top_k < vocab) {
    const torch::Tensor kth =
        std::get<0>(x.topk(filters.top_k, -1)).narrow(-1, filters.top_k - 1, 1);
    x = x.masked_fill(x < kth, neg_inf);
  }
  if (filters.top_p < 1) {
    auto [sorted, order] = x.sort(-1, /*descending=*/true);
    const torch::Tensor probs = sorted.softmax(-1);
    // Drop a token when the tokens ranked above it already hold top_p; the first always stays.
    const torch::Tensor drop_sorted = (probs.cumsum(-1) - probs) >= filters.top_p;
    const torch::Tensor drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    x = x.masked_fill(drop, neg_inf);
  }
  const torch::Tensor cdf = x.softmax(-1).to(torch::kFloat64).cumsum(-1);
  // right=true: the first token whose cumulative mass exceeds the target, never one of mass 0.
  const torch::Tensor target =
      uniforms.to(cdf.device(), torch::kFloat64).unsqueeze(1) * cdf.narrow(1, vocab - 1, 1);
  return torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
      .clamp_max(vocab - 1)
      .view({-1})
      .to(torch::kCPU, torch::kInt64);
}

torch::Tensor SampleTokensOnCpu(const torch::Tensor& logits, const SamplingFilters& filters,
                                const torch::Tensor& uniforms, CpuSamplingBuffers* buffers) {
  CheckShapes(logits, uniforms);
  CpuSamplingBuffers local;
  CpuSamplingBuffers& b = buffers != nullptr ? *buffers : local;
  const auto sized = [&logits](torch::Tensor& t) -> torch::Tensor& {
    if (!t.defined() || t.sizes() != logits.sizes()) t = torch::empty(logits.sizes());
    return t;
  };
  torch::Tensor x = logits.to(torch::kCPU, torch::kFloat32).contiguous();
  if (filters.temperature != 1) {
    x = at::div_out(sized(b.scaled), x, torch::scalar_tensor(filters.temperature, torch::kFloat64));
  }
  const torch::Tensor& p = at::_softmax_out(sized(b.probs), x, 1, /*half_to_float=*/false);
  const torch::Tensor u = uniforms.to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t batch = x.size(0), vocab = x.size(1);
  const bool top_k = filters.top_k > 0 && filters.top_k < vocab, top_p = filters.top_p < 1;
  torch::Tensor ids = torch::empty({batch}, torch::kInt64);
  const float* xs = x.data_ptr<float>();
  float* ps = p.data_ptr<float>();  // our buffer: top-p zeroes what it drops
  const double* us = u.data_ptr<double>();
  int64_t* out = ids.data_ptr<int64_t>();
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Scratch s;
    std::vector<int64_t> kept;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xs + r * vocab;
      float* pr = ps + r * vocab;
      if (top_k) {
        TopK(xr, vocab, filters.top_k, s, kept);
        if (top_p) TopPOfList(xr, pr, filters.top_p, kept, s);
        out[r] = DrawFromList(pr, kept, us[r]);
      } else {
        if (top_p) ZeroOutside(xr, pr, vocab, TopPCut(xr, pr, vocab, filters.top_p, s));
        out[r] = Draw(pr, vocab, us[r], s.blocks);
      }
    }
  });
  return ids;
}

}  // namespace trainctl::model::internal
