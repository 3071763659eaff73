// Qwen2-VL and Qwen2.5-VL against HF transformers' own code: for each family a tiny random
// checkpoint and the logits and greedy ids HF's Qwen2VLForConditionalGeneration /
// Qwen2_5_VLForConditionalGeneration computed on it (fp32, eager attention, CPU), written by
// tests/model/fixtures/make_hf_fixtures.py. The checkpoint loads unchanged; forward logits match
// to 1e-4 of their largest magnitude at every non-padding position, for text with left padding,
// one image (for Qwen2.5-VL, windows cut at its edges), two images of different sizes in a row,
// and both image rows in one left-padded batch; KV-cached greedy generation emits HF's ids.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::model {
namespace {

constexpr char kFixtures[] = TRAINCTL_SOURCE_DIR "/tests/model/fixtures/";
constexpr int64_t kPatchDim = 3 * 2 * 14 * 14;

// The fixture script's pixels of an image: ((k * 7919 + salt) mod 2001) / 1000 - 1 in float32.
torch::Tensor Pixels(int64_t patches, int64_t salt) {
  const torch::Tensor k = torch::arange(patches * kPatchDim, torch::kLong);
  return ((k * 7919 + salt) % 2001)
      .to(torch::kFloat32)
      .div(1000)
      .sub(1)
      .reshape({patches, kPatchDim});
}

struct Fixture {
  std::string folder;  // under tests/model/fixtures/
  ModelFamily family;
};

void PrintTo(const Fixture& fixture, std::ostream* os) { *os << fixture.folder; }

class HfFixtureTest : public ::testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    const std::string dir = std::string(kFixtures) + GetParam().folder;
    auto model = LoadHfModel(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *model;
    model_->eval();
    auto expected = SafetensorsFile::Open(dir + "/expected.safetensors");
    ASSERT_TRUE(expected.ok()) << expected.status();
    expected_ = std::move(*expected);
  }

  torch::Tensor Expected(const std::string& name) const {
    auto t = expected_->Get(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? t->clone() : torch::Tensor();
  }

  // The case's inputs; its images' pixels from their grids and salts.
  ModelInputs Inputs(const std::string& name) const {
    ModelInputs in{Expected(name + ".input_ids"), Expected(name + ".attention_mask"), {}, {}};
    if (expected_->Find(name + ".image_grid_thw") != nullptr) {
      in.image_grid_thw = Expected(name + ".image_grid_thw");
      const torch::Tensor salts = Expected(name + ".pixel_salts");
      std::vector<torch::Tensor> images;
      for (int64_t i = 0; i < in.image_grid_thw.size(0); ++i) {
        images.push_back(
            Pixels(in.image_grid_thw[i].prod().item<int64_t>(), salts[i].item<int64_t>()));
      }
      in.pixel_values = torch::cat(images);
    }
    return in;
  }

  std::shared_ptr<Qwen2VLForConditionalGeneration> model_;
  std::unique_ptr<SafetensorsFile> expected_;
};

TEST_P(HfFixtureTest, TheCheckpointIsTheFamily) {
  EXPECT_EQ(model_->config().family(), GetParam().family);
  EXPECT_EQ(model_->config().vocab_size, 512);
}

TEST_P(HfFixtureTest, LogitsEqualHfAtEveryTokenPosition) {
  torch::NoGradGuard no_grad;
  for (const std::string name : {"text", "one_image", "two_images", "batch"}) {
    SCOPED_TRACE(name);
    const ModelInputs in = Inputs(name);
    const torch::Tensor hf = Expected(name + ".logits");
    const torch::Tensor ours = model_->forward(in);
    ASSERT_EQ(ours.sizes(), hf.sizes());
    const torch::Tensor tokens = in.attention_mask.to(torch::kBool);
    const torch::Tensor diff = (ours - hf).abs().index({tokens});
    const double scale = hf.abs().index({tokens}).max().item<double>();
    EXPECT_GT(scale, 1.0);  // the weights make the logits large, not near zero
    EXPECT_LE(diff.max().item<double>(), 1e-4 * scale);
  }
}

TEST_P(HfFixtureTest, CachedGreedyGenerationEmitsHfIds) {
  for (const std::string name : {"text", "batch"}) {
    SCOPED_TRACE(name);
    const torch::Tensor hf = Expected(name + ".greedy");
    // Margins well above the 1e-4 agreement: equal ids are a test, not luck.
    EXPECT_GT(Expected(name + ".margin").min().item<double>(), 1e-2);
    GenerationOptions options;
    options.max_new_tokens = hf.size(1);
    options.temperature = 0;
    options.pad_token_id = 0;
    auto out = Generate(*model_, Inputs(name), options);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(static_cast<int64_t>(out->tokens.size()), hf.size(0));
    for (int64_t row = 0; row < hf.size(0); ++row) {
      const torch::Tensor want = hf[row];
      EXPECT_EQ(out->tokens[row], std::vector<int64_t>(want.data_ptr<int64_t>(),
                                                       want.data_ptr<int64_t>() + want.numel()))
          << "row " << row;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfFixtureTest,
                         ::testing::Values(Fixture{"qwen2vl_hf", ModelFamily::kQwen2VL},
                                           Fixture{"qwen25vl_hf", ModelFamily::kQwen25VL}),
                         [](const ::testing::TestParamInfo<Fixture>& param) {
                           return param.param.folder;
                         });

}  // namespace
}  // namespace trainctl::model
