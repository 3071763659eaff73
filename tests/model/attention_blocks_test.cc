// The eager attention's query blocks (attention.h): with the score budget forcing many blocks the
// outputs and gradients equal the one-matrix path's within 1e-5 (float32) for GQA, padding masks,
// causal attention without a mask and the vision tower's per-image attention; and a large image's
// attention never builds [heads, N, N] scores.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>

#include "tests/model/model_test_util.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/text_decoder.h"

namespace trainctl::model {
namespace {

using testing::Grid;
using testing::Ids;
using testing::ImageTokens;
using testing::RandomPixels;
using testing::TinyConfig;

// Sets the score budget for a scope and restores the default after.
class ScopedScoreBudget {
 public:
  explicit ScopedScoreBudget(int64_t elements) { SetAttentionScoreBudget(elements); }
  ~ScopedScoreBudget() { SetAttentionScoreBudget(kDefaultAttentionScoreBudget); }
};

constexpr int64_t kUnlimited = int64_t{1} << 62;

torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& allowed, bool causal, int64_t budget) {
  ScopedScoreBudget scope(budget);
  return DotProductAttention(AttentionImpl::kEager, q, k, v, allowed, causal);
}

TEST(AttentionBlocksTest, QueryChunkFollowsTheBudget) {
  ScopedScoreBudget scope(1000);
  EXPECT_EQ(AttentionQueryChunk(2, 50, 100), 5);   // 5 rows x 2 heads x 100 keys = 1000
  EXPECT_EQ(AttentionQueryChunk(2, 3, 100), 3);    // never more rows than there are
  EXPECT_EQ(AttentionQueryChunk(20, 50, 100), 1);  // never fewer than one
  SetAttentionScoreBudget(kDefaultAttentionScoreBudget);
  // A 4000x4000 photo at the default max_pixels: 65,536 patches, 16 heads: 32 rows a block.
  EXPECT_EQ(AttentionQueryChunk(16, 65536, 65536), 32);
}

TEST(AttentionBlocksTest, BlocksEqualOneMatrix) {
  torch::manual_seed(3);
  const int64_t b = 2, h = 4, hkv = 2, t = 37, d = 8;
  const torch::Tensor q = torch::randn({b, h, t, d});
  const torch::Tensor k = torch::randn({b, hkv, t, d});
  const torch::Tensor v = torch::randn({b, hkv, t, d});
  // Row 1 is left-padded by 5: causal and padding, as CausalPaddingMask builds it.
  torch::Tensor mask = torch::ones({b, t}, torch::kInt64);
  mask.index_put_({1, torch::indexing::Slice(0, 5)}, 0);
  const torch::Tensor idx = torch::arange(t);
  const torch::Tensor allowed = (idx.unsqueeze(0) <= idx.unsqueeze(1))
                                    .view({1, 1, t, t})
                                    .logical_and(mask.ne(0).view({b, 1, 1, t}));
  for (int64_t budget : {int64_t{1}, b * h * t * 3, b * h * t * 10 + 7}) {
    SCOPED_TRACE(budget);
    EXPECT_TRUE(torch::allclose(Attend(q, k, v, allowed, true, budget),
                                Attend(q, k, v, allowed, true, kUnlimited), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(Attend(q, k, v, {}, true, budget),
                                Attend(q, k, v, {}, true, kUnlimited), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(Attend(q, k, v, {}, false, budget),
                                Attend(q, k, v, {}, false, kUnlimited), 1e-5, 1e-5));
  }
  // Gradients through the blocks too.
  auto grads = [&](int64_t budget) {
    torch::Tensor qg = q.clone().requires_grad_(true);
    torch::Tensor kg = k.clone().requires_grad_(true);
    Attend(qg, kg, v, allowed, true, budget).pow(2).sum().backward();
    return std::make_pair(qg.grad(), kg.grad());
  };
  const auto blocked = grads(b * h * t * 4);
  const auto whole = grads(kUnlimited);
  EXPECT_TRUE(torch::allclose(blocked.first, whole.first, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(blocked.second, whole.second, 1e-5, 1e-5));
}

// A key mask [B, 1, 1, S] with causal is CausalPaddingMask's [B, 1, T, T] matrix without the
// matrix; with T = 1 (a decoding step over S cached keys) it is the key mask alone.
TEST(AttentionBlocksTest, KeyMaskWithCausalIsThePaddedCausalMask) {
  torch::manual_seed(4);
  const int64_t b = 2, h = 4, hkv = 2, t = 23, d = 8;
  const torch::Tensor q = torch::randn({b, h, t, d});
  const torch::Tensor k = torch::randn({b, hkv, t, d});
  const torch::Tensor v = torch::randn({b, hkv, t, d});
  torch::Tensor mask = torch::ones({b, t}, torch::kInt64);
  mask.index_put_({0, torch::indexing::Slice(0, 7)}, 0);
  const torch::Tensor keys = mask.ne(0).view({b, 1, 1, t});
  const torch::Tensor full = CausalPaddingMask(mask, b, t, torch::kCPU);
  for (int64_t budget : {int64_t{1}, b * h * t * 5, kUnlimited}) {
    SCOPED_TRACE(budget);
    EXPECT_TRUE(torch::allclose(Attend(q, k, v, keys, true, budget),
                                Attend(q, k, v, full, true, kUnlimited), 1e-6, 1e-6));
  }
  const torch::Tensor step = q.narrow(2, t - 1, 1);
  EXPECT_TRUE(torch::allclose(Attend(step, k, v, keys, true, kUnlimited),
                              Attend(step, k, v, keys, false, kUnlimited), 1e-6, 1e-6));
}

// The tiny model with two images and text: logits with 1-row blocks equal the one-matrix logits.
TEST(AttentionBlocksTest, TinyModelWithImagesUnchanged) {
  torch::manual_seed(5);
  Qwen2VLForConditionalGeneration model(TinyConfig());
  model.InitWeights(0.05);
  model.SetAttentionImpl(AttentionImpl::kEager);
  model.eval();
  const std::vector<int64_t> row =
      testing::Concat({{1, 2, 3}, ImageTokens(6), {4, 5}, ImageTokens(2), {6, 7, 8, 9}});
  const ModelInputs inputs{
      Ids({row}), {}, RandomPixels({{1, 4, 6}, {1, 2, 4}}), Grid({{1, 4, 6}, {1, 2, 4}})};
  torch::NoGradGuard no_grad;
  torch::Tensor whole, blocked;
  {
    ScopedScoreBudget scope(kUnlimited);
    whole = model.forward(inputs);
  }
  {
    ScopedScoreBudget scope(1);
    ResetLargestAttentionScores();
    blocked = model.forward(inputs);
    // One query row of one head at a time (batch 1; the decoder's heads and the vision tower's
    // run as one [1, H, rows, S] block, so rows are 1 and the block is H x S).
    EXPECT_LE(LargestAttentionScores(), 4 * static_cast<int64_t>(row.size()));
  }
  EXPECT_TRUE(torch::allclose(blocked, whole, 1e-5, 1e-5))
      << (blocked - whole).abs().max().item<float>();
}

// A left-padded batch through the model (the key mask path) in 1-row blocks equals one matrix.
TEST(AttentionBlocksTest, PaddedBatchUnchanged) {
  torch::manual_seed(6);
  Qwen2VLForConditionalGeneration model(TinyConfig());
  model.InitWeights(0.05);
  model.SetAttentionImpl(AttentionImpl::kEager);
  model.eval();
  const ModelInputs inputs{Ids({{0, 0, 0, 5, 6, 7, 8, 9}, {1, 2, 3, 4, 5, 6, 7, 8}}),
                           Ids({{0, 0, 0, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1}}),
                           {},
                           {}};
  torch::NoGradGuard no_grad;
  torch::Tensor whole, blocked;
  {
    ScopedScoreBudget scope(kUnlimited);
    whole = model.forward(inputs);
  }
  {
    ScopedScoreBudget scope(1);
    blocked = model.forward(inputs);
  }
  const torch::Tensor real = Ids({{0, 0, 0, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1}}).ne(0);
  EXPECT_TRUE(torch::allclose(blocked.index({real}), whole.index({real}), 1e-5, 1e-5));
}

// A 112x112-patch image (12,544 patches, 2 heads) in the vision tower under a budget of 64 rows:
// the largest score tensor is 2 x 64 x N, never 2 x N x N (1.2 GiB in float32).
TEST(AttentionBlocksTest, LargeImageScoresStayBounded) {
  torch::manual_seed(7);
  Qwen2VLForConditionalGeneration model(TinyConfig());
  model.InitWeights(0.05);
  model.SetAttentionImpl(AttentionImpl::kEager);
  model.eval();
  const int64_t side = 112, n = side * side, heads = 2;
  const torch::Tensor pixels = RandomPixels({{1, side, side}});
  torch::NoGradGuard no_grad;
  ScopedScoreBudget scope(heads * 64 * n);
  ResetLargestAttentionScores();
  const torch::Tensor features = model.visual->forward(pixels, Grid({{1, side, side}}));
  EXPECT_EQ(features.size(0), n / 4);
  EXPECT_EQ(LargestAttentionScores(), heads * 64 * n);
  EXPECT_LT(LargestAttentionScores() * 100, heads * n * n);
}

}  // namespace
}  // namespace trainctl::model
