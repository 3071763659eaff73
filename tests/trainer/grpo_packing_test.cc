// GRPO's scoring pass packed padding-free (training.packing): rows of different prompt and
// completion lengths, one with an image and one with two, packed first-fit into fewer, shorter
// rows give the padded layout's per-token log-probabilities and the same loss gradients on every
// parameter; the packed batch is smaller than the padded one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "common/data/batch.h"
#include "tests/model/model_test_util.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/stages/grpo_loss.h"
#include "worker/trainer/stages/internal/grpo_rows.h"

namespace trainctl::trainer {
namespace {

using internal::GrpoRow;
using internal::TrainInputs;
using model::testing::Concat;
using model::testing::ImageTokens;
using Tokens = std::vector<int64_t>;

constexpr int64_t kPad = 151643;
constexpr int64_t kPackLength = 32;

GrpoRow Row(Tokens prompt, Tokens completion, const std::vector<Tokens>& grids, double advantage) {
  GrpoRow row;
  row.prompt = std::move(prompt);
  row.completion = std::move(completion);
  row.advantage = advantage;
  for (const Tokens& g : grids) {
    row.grid.insert(row.grid.end(), g.begin(), g.end());
    const torch::Tensor pixels = torch::randn({g[0] * g[1] * g[2], data::kPatchDim});
    row.pixel_values.insert(row.pixel_values.end(), pixels.data_ptr<float>(),
                            pixels.data_ptr<float>() + pixels.numel());
  }
  return row;
}

// Six rows, 9 to 23 tokens. First fit into rows of 32: {0, 1}, {2, 4}, {3, 5}, so the images
// come in the order of rows 1, 4, 3, not 1, 3, 4.
std::vector<GrpoRow> SampleRows() {
  std::vector<GrpoRow> rows;
  rows.push_back(Row({10, 11, 12, 13, 14, 15, 16}, {50, 51, 52, 53, 54}, {}, 1.5));
  rows.push_back(
      Row(Concat({{20, 21}, ImageTokens(4), {22, 23, 24}}), {60, 61}, {{1, 4, 4}}, -0.8));
  rows.push_back(Row({17, 18, 19}, {70, 71, 72, 73, 74, 75, 76, 77}, {}, 0.4));
  rows.back().truncated = true;
  rows.push_back(Row(Concat({{30}, ImageTokens(4), {31, 32}, ImageTokens(8), {33}}), {80, 81, 82},
                     {{1, 4, 4}, {1, 4, 8}}, -1.2));
  rows.push_back(Row(Concat({{40}, ImageTokens(8), {41}}), {90}, {{1, 8, 4}}, 0.9));
  rows.push_back(Row({42, 43, 44}, {95, 96, 97, 98, 99, 100}, {}, -0.3));
  return rows;
}

// 1 where a row has a completion token, whether or not truncation masks it out of the loss.
torch::Tensor RealTokens(const std::vector<GrpoRow>& rows, int64_t width) {
  torch::Tensor real = torch::zeros({static_cast<int64_t>(rows.size()), width}, torch::kBool);
  for (size_t i = 0; i < rows.size(); ++i) {
    real[static_cast<int64_t>(i)]
        .slice(0, 0, static_cast<int64_t>(rows[i].completion.size()))
        .fill_(true);
  }
  return real;
}

struct Scored {
  torch::Tensor logps;
  std::map<std::string, torch::Tensor> grads;
};

// Log-probabilities of `in`, then GRPO's loss (KL to a fixed reference, a fixed old policy so
// that some ratios clip) and its gradients on every parameter.
Scored ScoreAndBackward(model::Qwen2VLForConditionalGeneration& model, const TrainInputs& in,
                        const torch::Tensor& old, const torch::Tensor& ref) {
  Scored out;
  const torch::Tensor logps = internal::TrainLogProbs(model, in);
  GrpoLossInputs li;
  li.per_token_logps = logps;
  li.old_per_token_logps = old;
  li.ref_per_token_logps = ref;
  li.advantages = in.advantages;
  li.completion_mask = in.completion_mask;
  GrpoLossOptions options;
  options.loss_type = GrpoLossType::kGrpo;
  options.beta = 0.04;
  const absl::StatusOr<GrpoLossOutput> loss = GrpoLoss(li, options, GrpoStepShape());
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return out;
  loss->contribution.backward();
  out.logps = logps.detach();
  out.grads = model::testing::TakeGradients(model);
  return out;
}

TEST(GrpoPackingTest, PackedLogProbsAndGradientsEqualPadded) {
  torch::manual_seed(3);
  model::Qwen2VLForConditionalGeneration model(model::testing::TinyConfig());
  model.InitWeights(0.1);
  model.train();
  const std::vector<GrpoRow> rows = SampleRows();
  const int64_t n = static_cast<int64_t>(rows.size());
  const TrainInputs padded =
      internal::MakeTrainInputs(rows, 0, n, kPad, /*mask_truncated=*/true, torch::kCPU);
  const TrainInputs packed = internal::MakePackedTrainInputs(
      rows, 0, n, kPad, /*mask_truncated=*/true, kPackLength, torch::kCPU);
  ASSERT_TRUE(packed.packed());
  ASSERT_FALSE(padded.packed());
  EXPECT_TRUE(torch::equal(packed.completion_mask, padded.completion_mask));
  EXPECT_TRUE(torch::equal(packed.advantages, padded.advantages));

  torch::Tensor old, ref;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor base = internal::TrainLogProbs(model, padded);
    old = base + 0.3 * torch::randn(base.sizes());
    ref = base + 0.1 * torch::randn(base.sizes());
  }
  const Scored a = ScoreAndBackward(model, padded, old, ref);
  const Scored b = ScoreAndBackward(model, packed, old, ref);
  ASSERT_EQ(a.logps.sizes(), b.logps.sizes());
  const torch::Tensor real = RealTokens(rows, a.logps.size(1));
  EXPECT_TRUE(torch::allclose(a.logps.masked_select(real), b.logps.masked_select(real), 1e-5, 1e-5))
      << (a.logps - b.logps).masked_select(real).abs().max();
  EXPECT_TRUE(torch::isfinite(b.logps).all().item<bool>());
  ASSERT_EQ(a.grads.size(), b.grads.size());
  ASSERT_GT(a.grads.count("visual.patch_embed.proj.weight"), 0u) << "the images reach the loss";
  for (const auto& [name, grad] : a.grads) {
    ASSERT_GT(b.grads.count(name), 0u) << name;
    EXPECT_TRUE(torch::allclose(grad, b.grads.at(name), 1e-5, 1e-5))
        << name << ": " << (grad - b.grads.at(name)).abs().max();
  }
}

TEST(GrpoPackingTest, PackedBatchIsSmallerThanPadded) {
  torch::manual_seed(4);
  const std::vector<GrpoRow> rows = SampleRows();
  const int64_t n = static_cast<int64_t>(rows.size());
  const TrainInputs padded = internal::MakeTrainInputs(rows, 0, n, kPad, false, torch::kCPU);
  const TrainInputs packed =
      internal::MakePackedTrainInputs(rows, 0, n, kPad, false, kPackLength, torch::kCPU);
  // Padded: 6 rows of the longest prompt (20) + the longest completion (8). Packed: 3 rows of
  // the fullest packed row (rows 3 and 5: 23 + 9).
  EXPECT_EQ(padded.inputs.input_ids.sizes(), (std::vector<int64_t>{6, 28}));
  EXPECT_EQ(packed.inputs.input_ids.sizes(), (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(packed.inputs.segment_ids.sizes(), packed.inputs.input_ids.sizes());
  EXPECT_EQ(packed.inputs.attention_mask.sum().item<int64_t>(),
            padded.inputs.attention_mask.sum().item<int64_t>());
  EXPECT_EQ(packed.inputs.segment_ids.max().item<int64_t>(), 2);
  EXPECT_EQ(packed.predictors.sizes(), (std::vector<int64_t>{6, 8}));
  // The images in packed order: rows 1, 4, 3.
  EXPECT_TRUE(torch::equal(
      packed.inputs.image_grid_thw,
      torch::tensor({1, 4, 4, 1, 8, 4, 1, 4, 4, 1, 4, 8}, torch::kInt64).view({-1, 3})));
  // pack_length below the longest row: packed rows of that row's 23 tokens, {0, 2}, {1, 5}, {3},
  // {4}.
  const TrainInputs shorter =
      internal::MakePackedTrainInputs(rows, 0, n, kPad, false, /*pack_length=*/1, torch::kCPU);
  EXPECT_EQ(shorter.inputs.input_ids.sizes(), (std::vector<int64_t>{4, 23}));
}

}  // namespace
}  // namespace trainctl::trainer
