// The reward model on a tiny Qwen2-VL with a *ForSequenceClassification head, saved as an HF
// checkpoint and loaded through a frozen ZeRO engine (world size 1): its scores equal a plain
// single-process forward's last-token hidden state, after the final norm, dotted with
// score.weight, whatever the padding; a causal LM directory is refused with what it holds.
#include "worker/trainer/rewards/reward_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/model/model_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::rewards {
namespace {

using model::Qwen2VLConfig;
using model::Qwen2VLForConditionalGeneration;
using ::trainctl::testing::TempDir;

constexpr int64_t kPad = 0;

// The tiny registry model with a small vocabulary (text-only rows) to keep checkpoints small.
Qwen2VLConfig Config(int64_t num_labels, bool tied) {
  Qwen2VLConfig c = model::testing::TinyConfig();
  c.vocab_size = 512;
  c.tie_word_embeddings = tied;
  c.num_labels = num_labels;
  return c;
}

std::unique_ptr<zero::Comm> Local() {
  auto comm = zero::Comm::Create(zero::CommOptions{});
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

const std::vector<std::vector<int64_t>> kRows = {
    {5, 17, 33, 2, 90},
    {7, 8, 9, 10, 11, 12, 13, 14},
    {101, 44, 3},
};

// Rows padded to the longest, on the right or the left, with their attention mask.
model::ModelInputs Padded(bool left) {
  size_t width = 0;
  for (const auto& r : kRows) width = std::max(width, r.size());
  std::vector<std::vector<int64_t>> ids, mask;
  for (const auto& r : kRows) {
    std::vector<int64_t> pad(width - r.size(), kPad), zeros(width - r.size(), 0);
    std::vector<int64_t> ones(r.size(), 1);
    ids.push_back(left ? model::testing::Concat({pad, r}) : model::testing::Concat({r, pad}));
    mask.push_back(left ? model::testing::Concat({zeros, ones})
                        : model::testing::Concat({ones, zeros}));
  }
  model::ModelInputs in;
  in.input_ids = model::testing::Ids(ids);
  in.attention_mask = model::testing::Ids(mask);
  return in;
}

// Each row alone, unpadded, in the plain model: norm(hidden[last]) . score.weight[0].
std::vector<double> Expected(Qwen2VLForConditionalGeneration& net) {
  torch::NoGradGuard no_grad;
  std::vector<double> out;
  for (const auto& r : kRows) {
    model::ModelInputs in;
    in.input_ids = model::testing::Ids({r});
    const torch::Tensor hidden = net.ForwardHidden(in)[0][static_cast<int64_t>(r.size()) - 1];
    const torch::Tensor normed = net.language_model->norm->forward(hidden);
    out.push_back(normed.dot(net.score->weight[0]).item<double>());
  }
  return out;
}

class RewardModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(11);
    net_ = std::make_shared<Qwen2VLForConditionalGeneration>(Config(1, /*tied=*/true));
    // Scores of the N(0, 0.02) initialisation are tiny; a larger head makes the check sharper.
    torch::NoGradGuard no_grad;
    net_->score->weight.normal_(0, 1.0);
    ASSERT_TRUE(model::SaveHfCheckpoint(*net_, dir_.path()).ok());
  }

  TempDir dir_;
  std::shared_ptr<Qwen2VLForConditionalGeneration> net_;
};

TEST_F(RewardModelTest, ScoreHeadReplacesLmHead) {
  const auto params = net_->named_parameters();
  ASSERT_NE(params.find("score.weight"), nullptr);
  EXPECT_EQ(params.find("lm_head.weight"), nullptr);
  EXPECT_EQ(params["score.weight"].sizes(), torch::IntArrayRef({1, 64}));
  EXPECT_EQ(net_->forward(Padded(false)).sizes(), torch::IntArrayRef({3, 8, 1}));
  EXPECT_EQ(net_->Units().back().modules.back().first, "score");
  // The saved config names the classifier and one label, and reads back as such.
  auto config = model::LoadQwen2VLConfig(dir_.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_labels, 1);
  EXPECT_NE(model::Qwen2VLConfigToJson(*config).find("Qwen2VLForSequenceClassification"),
            std::string::npos);
}

TEST_F(RewardModelTest, ScoresEqualPlainForwardAtLastToken) {
  const std::vector<double> expected = Expected(*net_);
  auto comm = Local();
  for (int stage : {0, 3}) {
    zero::EngineOptions options;
    options.stage = stage;
    auto rm = RewardModel::Load(dir_.path(), options, comm.get());
    ASSERT_TRUE(rm.ok()) << rm.status();
    EXPECT_TRUE((*rm)->engine().frozen());
    for (bool left : {false, true}) {
      auto scores = (*rm)->Score(Padded(left));
      ASSERT_TRUE(scores.ok()) << scores.status();
      ASSERT_EQ(scores->size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_NEAR((*scores)[i], expected[i], 1e-4) << "stage " << stage << " left " << left;
      }
    }
    // Distinct rows give distinct scores: the check is not vacuous.
    EXPECT_GT(std::abs(expected[0] - expected[1]), 1e-3);
  }
}

TEST_F(RewardModelTest, RowWithoutTokensIsRefused) {
  auto comm = Local();
  auto rm = RewardModel::Load(dir_.path(), zero::EngineOptions{}, comm.get());
  ASSERT_TRUE(rm.ok()) << rm.status();
  model::ModelInputs in = Padded(false);
  in.attention_mask[2].zero_();
  EXPECT_EQ((*rm)->Score(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RewardModelLoadTest, CausalLmDirectoryIsRefused) {
  auto comm = Local();
  for (bool tied : {false, true}) {
    TempDir dir;
    Qwen2VLForConditionalGeneration lm(Config(0, tied));
    ASSERT_TRUE(model::SaveHfCheckpoint(lm, dir.path()).ok());
    auto rm = RewardModel::Load(dir.path(), zero::EngineOptions{}, comm.get());
    ASSERT_FALSE(rm.ok());
    EXPECT_EQ(rm.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(rm.status().message());
    EXPECT_NE(message.find("reward model " + dir.path() + " has no score.weight"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("[1, 64]"), std::string::npos) << message;
    if (!tied) {
      EXPECT_NE(message.find("found lm_head.weight"), std::string::npos) << message;
      EXPECT_NE(message.find("causal LM checkpoint"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace trainctl::rewards
