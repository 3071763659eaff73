// The CPU sampler (block sums, radix-selected top-k / top-p cuts) against the tensor-op path that
// CUDA runs (sort, float64 cumulative sum, searchsorted), given the same uniform numbers; and its
// draws' frequencies against the filtered softmax on a small vocabulary.
#include "worker/trainer/model/internal/sampling.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

namespace trainctl::model::internal {
namespace {

std::string Name(const SamplingFilters& f) {
  return "temperature " + std::to_string(f.temperature) + ", top_k " + std::to_string(f.top_k) +
         ", top_p " + std::to_string(f.top_p);
}

const std::vector<SamplingFilters> kFilters = {
    {1.0, 0, 1.0},  {0.7, 0, 1.0}, {1.3, 50, 1.0}, {1.0, 0, 0.9},
    {0.8, 40, 0.8}, {1.0, 1, 1.0}, {1.0, 0, 0.05}, {2.0, 900, 0.99},
};

constexpr int64_t kGridRows = 40, kGridCount = 8;  // where MixedLogits has rows on a grid

// Rows of several kinds: spread logits, peaked ones (one token holds nearly all the mass, a few
// share it), logits on a coarse grid (many exact ties, at the top-k cut too), and a row whose
// mass sits in a few hundred tokens spread over the vocabulary.
torch::Tensor MixedLogits(int64_t vocab) {
  torch::manual_seed(11);
  std::vector<torch::Tensor> rows;
  for (int i = 0; i < 24; ++i) rows.push_back(torch::randn({vocab}) * (0.5 + i * 0.25));
  for (int i = 0; i < 8; ++i) {
    torch::Tensor r = torch::randn({vocab});
    r[(i * 97) % vocab] += 25;
    rows.push_back(r);
  }
  for (int i = 0; i < 8; ++i) {
    torch::Tensor r = torch::randn({vocab});
    r.narrow(0, 10 * i, 5 + i) += 9;
    rows.push_back(r);
  }
  for (int i = 0; i < kGridCount; ++i) rows.push_back((torch::randn({vocab}) * 4).round() / 2);
  torch::Tensor sparse = torch::full({vocab}, -30.0f);
  sparse.index_put_({torch::randperm(vocab).narrow(0, 0, 300)}, torch::randn({300}));
  rows.push_back(sparse);
  return torch::stack(rows);
}

TEST(SamplingTest, CpuDrawsTheSameIdsAsTheTensorPath) {
  constexpr int64_t kVocab = 5000;  // more than top-k's first room (1024): its threshold rises
  const torch::Tensor logits = MixedLogits(kVocab);
  const int64_t batch = logits.size(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (const SamplingFilters& f : kFilters) {
    SCOPED_TRACE(Name(f));
    for (int draw = 0; draw < 12; ++draw) {
      torch::Tensor u = torch::empty({batch}, torch::kFloat64);
      u.uniform_(0, 1, gen);
      if (draw == 0) {  // the ends of [0, 1)
        u[0] = 0.0;
        u[1] = std::nextafter(1.0, 0.0);
      }
      const torch::Tensor differ =
          SampleTokensOnCpu(logits, f, u).ne(SampleTokensOnDevice(logits, f, u));
      // The sort's order among tied logits decides the tensor path's top-p cut (the CPU path
      // takes ties in id order; FrequenciesMatchTheFilteredSoftmax checks that): the rows on a
      // grid are compared without top-p only.
      if (f.top_p < 1) differ.narrow(0, kGridRows, kGridCount).fill_(false);
      ASSERT_FALSE(differ.any().item<bool>())
          << "draw " << draw << ", rows " << differ.nonzero().view({-1});
    }
  }
  // bfloat16 logits (autocast) go through float32 on both paths; with 8 bits of mantissa they tie
  // everywhere, so without top-p.
  const torch::Tensor u = torch::rand({batch}, torch::kFloat64);
  const torch::Tensor half = logits.to(torch::kBFloat16);
  for (const SamplingFilters& f : kFilters) {
    if (f.top_p < 1) continue;
    SCOPED_TRACE("bfloat16, " + Name(f));
    EXPECT_TRUE(SampleTokensOnCpu(half, f, u).equal(SampleTokensOnDevice(half, f, u)));
  }
}

// Frequencies of 40,000 draws from one row against its filtered softmax: within 5 standard
// deviations for every kept token, none for a filtered one.
TEST(SamplingTest, FrequenciesMatchTheFilteredSoftmax) {
  const std::vector<float> row = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f, 1.0f, -0.5f};
  const auto vocab = static_cast<int64_t>(row.size());
  constexpr int64_t kDraws = 40000;
  const torch::Tensor logits = torch::tensor(row).expand({kDraws, vocab}).contiguous();
  struct Case {
    SamplingFilters filters;
    std::vector<double> probs;  // by hand: softmax of the kept logits / temperature
  };
  const auto softmax = [&row](double temperature, const std::vector<int>& kept) {
    std::vector<double> p(row.size(), 0.0);
    double total = 0;
    for (int i : kept) total += p[static_cast<size_t>(i)] = std::exp(row[i] / temperature);
    for (double& x : p) x /= total;
    return p;
  };
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<Case> cases = {
      {{1.0, 0, 1.0}, softmax(1.0, all)},
      {{0.5, 0, 1.0}, softmax(0.5, all)},
      // The 3rd largest logit is 1.0, held by tokens 1 and 6: both stay.
      {{1.0, 3, 1.0}, softmax(1.0, {0, 1, 6})},
      // Mass 0.448, 0.165 (twice), 0.100, ...: 0.8 takes four tokens (0.877; three hold 0.777).
      {{1.0, 0, 0.8}, softmax(1.0, {0, 1, 6, 2})},
      // Tied at the cut: 0.448 + 0.165 reaches 0.5 with token 1, the lower id of the tie.
      {{1.0, 0, 0.5}, softmax(1.0, {0, 1})},
      // Top-4 keeps 0, 1, 6, 2 (0.510, 0.188, 0.188, 0.114 of theirs); 0.6 then takes two.
      {{1.0, 4, 0.6}, softmax(1.0, {0, 1})},
  };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2026);
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c.filters));
    torch::Tensor u = torch::empty({kDraws}, torch::kFloat64);
    u.uniform_(0, 1, gen);
    const torch::Tensor ids = SampleTokensOnCpu(logits, c.filters, u);
    const torch::Tensor counts = torch::bincount(ids, {}, vocab).to(torch::kFloat64);
    for (int64_t i = 0; i < vocab; ++i) {
      const double p = c.probs[static_cast<size_t>(i)];
      const double f = counts[i].item<double>() / kDraws;
      if (p == 0) {
        EXPECT_EQ(f, 0) << "token " << i;
      } else {
        EXPECT_NEAR(f, p, 5 * std::sqrt(p * (1 - p) / kDraws)) << "token " << i;
      }
    }
  }
}

TEST(SamplingTest, RefusesMismatchedShapes) {
  const torch::Tensor logits = torch::randn({3, 10});
  EXPECT_THROW(SampleTokensOnCpu(logits, {}, torch::rand({2}, torch::kFloat64)), c10::Error);
  EXPECT_THROW(SampleTokensOnCpu(torch::randn({10}), {}, torch::rand({1}, torch::kFloat64)),
               c10::Error);
}

}  // namespace
}  // namespace trainctl::model::internal
