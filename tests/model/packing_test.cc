// Padding-free packing: samples packed into one row with segment ids compute what they would
// alone: the summed next-token loss and every gradient, with text, one image and two images of
// different sizes in one row; positions restart per sample; samples never see each other.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "tests/model/model_test_util.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::model {
namespace {

using testing::Concat;
using testing::Grid;
using testing::Ids;
using testing::ImageTokens;
using testing::LossAndGrads;
using testing::RandomPixels;
using testing::TakeGradients;
using testing::TinyConfig;

struct Sample {
  std::vector<int64_t> ids;
  std::vector<std::vector<int64_t>> grids;
  torch::Tensor pixels;
};

torch::Tensor SummedLoss(Qwen2VLForConditionalGeneration& model, const ModelInputs& in,
                         const torch::Tensor& labels) {
  const torch::Tensor logits = model.forward(in);
  const int64_t t = in.input_ids.size(1);
  return torch::nn::functional::cross_entropy(
      logits.slice(1, 0, t - 1).reshape({-1, logits.size(-1)}), labels.slice(1, 1).reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
}

LossAndGrads Collect(Qwen2VLForConditionalGeneration& model, torch::Tensor loss) {
  loss.backward();
  return LossAndGrads{loss.detach(), TakeGradients(model)};
}

TEST(PackingTest, APackedRowComputesWhatItsSamplesWouldAlone) {
  torch::manual_seed(6);
  Qwen2VLForConditionalGeneration model(TinyConfig());
  model.InitWeights(0.1);
  model.train();
  std::vector<Sample> samples = {
      {{10, 11, 12, 13, 14, 15, 16}, {}, {}},
      {Concat({{20, 21}, ImageTokens(4), {22, 23, 24}}), {{1, 4, 4}}, RandomPixels({{1, 4, 4}})},
      {Concat({{30}, ImageTokens(1), {31, 32}, ImageTokens(4), {33}}),
       {{1, 2, 2}, {1, 4, 4}},
       RandomPixels({{1, 2, 2}, {1, 4, 4}})},
  };

  // Alone: each sample its own batch.
  torch::Tensor alone_loss = torch::zeros({});
  for (const Sample& s : samples) {
    ModelInputs in{Ids({s.ids}), torch::Tensor(), s.pixels,
                   s.grids.empty() ? torch::Tensor() : Grid(s.grids)};
    alone_loss = alone_loss + SummedLoss(model, in, in.input_ids);
  }
  const LossAndGrads alone = Collect(model, alone_loss);

  // Packed: one row, the samples back to back, then 3 padding tokens; the first token of each
  // sample is not a target (its previous position belongs to another sample).
  std::vector<int64_t> row, segments, labels, mask;
  std::vector<torch::Tensor> pixels;
  std::vector<std::vector<int64_t>> grids;
  for (size_t i = 0; i < samples.size(); ++i) {
    for (size_t k = 0; k < samples[i].ids.size(); ++k) {
      row.push_back(samples[i].ids[k]);
      segments.push_back(static_cast<int64_t>(i) + 1);
      labels.push_back(k == 0 ? -100 : samples[i].ids[k]);
      mask.push_back(1);
    }
    if (samples[i].pixels.defined()) pixels.push_back(samples[i].pixels);
    grids.insert(grids.end(), samples[i].grids.begin(), samples[i].grids.end());
  }
  for (int k = 0; k < 3; ++k) {
    row.push_back(151643);
    segments.push_back(0);
    labels.push_back(-100);
    mask.push_back(0);
  }
  ModelInputs packed{Ids({row}), Ids({mask}), torch::cat(pixels), Grid(grids)};
  packed.segment_ids = Ids({segments});
  const LossAndGrads together = Collect(model, SummedLoss(model, packed, Ids({labels})));

  EXPECT_NEAR(together.loss.item<double>(), alone.loss.item<double>(),
              1e-5 * alone.loss.item<double>());
  ASSERT_EQ(together.grads.size(), alone.grads.size());
  for (const auto& [name, g] : alone.grads) {
    const torch::Tensor& other = together.grads.at(name);
    // Relative to the gradient's scale: the packed row sums its terms in another order.
    const double diff = (other - g).abs().max().item<double>();
    const double scale = g.abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale + 1e-9) << name << ": max diff " << diff << ", max " << scale;
  }

  // Without the segments the same row is one sequence: the samples see each other.
  ModelInputs unsegmented = packed;
  unsegmented.segment_ids = torch::Tensor();
  torch::NoGradGuard no_grad;
  EXPECT_GT(std::abs(SummedLoss(model, unsegmented, Ids({labels})).item<double>() -
                     alone.loss.item<double>()),
            1e-3);
}

TEST(PackingTest, PositionsRestartAtEverySampleAndPaddingHoldsOne) {
  const Qwen2VLConfig config = TinyConfig();
  const auto row = Concat({{5, 6, 7}, {20}, ImageTokens(1), {21}, {0, 0}});
  const torch::Tensor segments = Ids({{1, 1, 1, 2, 2, 2, 2, 2, 0, 0}});
  const torch::Tensor pos = GetRopeIndex(config, Ids({row}), Grid({{1, 2, 2}}), {}, segments);
  // Sample 1: text 0, 1, 2. Sample 2: text 0, vision_start 1, the image at (2, 2, 2), its end 3,
  // then 4. Padding: 1.
  const std::vector<int64_t> expected = {0, 1, 2, 0, 1, 2, 3, 4, 1, 1};
  for (int axis = 0; axis < 3; ++axis) {
    for (int64_t j = 0; j < 10; ++j) {
      EXPECT_EQ(pos[axis][0][j].item<int64_t>(), expected[static_cast<size_t>(j)])
          << "axis " << axis << " position " << j;
    }
  }
  const torch::Tensor allowed = PackedCausalMask(segments, torch::kCPU);
  EXPECT_TRUE(allowed[0][0][2][0].item<bool>());   // within sample 1, causal
  EXPECT_FALSE(allowed[0][0][0][2].item<bool>());  // never the future
  EXPECT_FALSE(allowed[0][0][4][2].item<bool>());  // sample 2 never sees sample 1
  EXPECT_TRUE(allowed[0][0][8][8].item<bool>());   // padding: itself only
  EXPECT_FALSE(allowed[0][0][8][7].item<bool>());
}

// Per-sample attention (the varlen form) equals one masked attention over the whole rows under
// PackedCausalMask, values and gradients, with grouped-query heads, two rows, padding between and
// after samples; and it never builds a score matrix wider than its longest sample.
TEST(PackingTest, PerSampleAttentionEqualsTheBlockDiagonalMaskWithoutItsScores) {
  torch::manual_seed(3);
  const torch::Tensor segments =
      Ids({{1, 1, 1, 1, 1, 2, 2, 0, 3, 3, 3, 0}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2}});
  const PackedSamples samples = PackedSamplesOf(segments);
  ASSERT_EQ(samples.size(), 5u);
  EXPECT_EQ(samples.row, (std::vector<int64_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(samples.start, (std::vector<int64_t>{0, 5, 8, 0, 9}));
  EXPECT_EQ(samples.length, (std::vector<int64_t>{5, 2, 3, 9, 3}));
  EXPECT_EQ(samples.longest(), 9);

  auto leaf = [](std::vector<int64_t> shape) { return torch::randn(shape).requires_grad_(); };
  const torch::Tensor q = leaf({2, 4, 12, 8}), k = leaf({2, 2, 12, 8}), v = leaf({2, 2, 12, 8});
  const torch::Tensor token = segments.ne(0).view({2, 1, 12, 1});
  const torch::Tensor probe = torch::randn({2, 4, 12, 8});

  ResetLargestAttentionScores();
  const torch::Tensor packed = PackedCausalAttention(AttentionImpl::kEager, q, k, v, samples);
  EXPECT_LE(LargestAttentionScores(), 4 * 9 * 9);
  auto [dq, dk, dv] = [&] {
    auto g = torch::autograd::grad({(packed * probe).sum()}, {q, k, v});
    return std::make_tuple(g[0], g[1], g[2]);
  }();
  const torch::Tensor masked = DotProductAttention(
      AttentionImpl::kEager, q, k, v, PackedCausalMask(segments, torch::kCPU), /*causal=*/true);
  // Padding positions: zeros in the per-sample form, arbitrary in the masked one.
  EXPECT_TRUE(packed.masked_select(token.logical_not().expand_as(packed)).eq(0).all().item<bool>());
  EXPECT_LE((packed - masked).mul(token).abs().max().item<double>(), 1e-6);
  auto g = torch::autograd::grad({(masked * probe * token).sum()}, {q, k, v});
  EXPECT_LE((dq - g[0]).abs().max().item<double>(), 1e-5);
  EXPECT_LE((dk - g[1]).abs().max().item<double>(), 1e-5);
  EXPECT_LE((dv - g[2]).abs().max().item<double>(), 1e-5);
}

TEST(PackingTest, SamplesThatOverlapOrLeaveTheRowAreRefused) {
  const torch::Tensor q = torch::randn({1, 2, 6, 4}), kv = torch::randn({1, 2, 6, 4});
  PackedSamples overlap{{0, 0}, {0, 2}, {3, 3}};
  EXPECT_THROW(PackedCausalAttention(AttentionImpl::kEager, q, kv, kv, overlap), c10::Error);
  PackedSamples past_end{{0}, {4}, {3}};
  EXPECT_THROW(PackedCausalAttention(AttentionImpl::kEager, q, kv, kv, past_end), c10::Error);
  PackedSamples no_such_row{{1}, {0}, {2}};
  EXPECT_THROW(PackedCausalAttention(AttentionImpl::kEager, q, kv, kv, no_such_row), c10::Error);
}

}  // namespace
}  // namespace trainctl::model
