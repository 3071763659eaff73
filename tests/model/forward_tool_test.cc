// `trainctl-trainer forward` on a saved tiny model: the request file generate reads too, its images
// (relative to the file) run through the project's image processor and matched to single
// <|image_pad|> tokens, the mask expanded alongside; logits against the model's own forward on the
// same inputs built in-process. Also pixel_values_file, malformed requests, and `--help`.
#include "worker/trainer/forward_tool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/data/image_processor.h"
#include "nlohmann/json.hpp"
#include "tests/model/model_test_util.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/tool_request.h"

namespace trainctl::model {
namespace {

using ::trainctl::model::testing::Concat;
using ::trainctl::model::testing::Grid;
using ::trainctl::model::testing::Ids;
using ::trainctl::model::testing::ImageTokens;
using ::trainctl::model::testing::kImagePad;
using ::trainctl::model::testing::kVisionEnd;
using ::trainctl::model::testing::kVisionStart;
using ::trainctl::model::testing::RandomPixels;
using ::trainctl::model::testing::TinyConfig;
using Tokens = std::vector<int64_t>;

class ForwardToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    model_ = std::make_shared<Qwen2VLForConditionalGeneration>(TinyConfig());
    model_->InitWeights(0.15);
    model_->eval();
    ASSERT_TRUE(SaveHfCheckpoint(*model_, model_dir()).ok());
  }

  std::string model_dir() const { return dir_.path() + "/model"; }

  ::trainctl::testing::RunResult Trainer(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {TRAINCTL_TRAINER_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return ::trainctl::testing::Run(argv);
  }

  torch::Tensor ReadLogits(const std::string& path) {
    auto file = SafetensorsFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return {};
    auto logits = (*file)->Get("logits");
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : torch::Tensor();
  }

  ::trainctl::testing::TempDir dir_;
  std::shared_ptr<Qwen2VLForConditionalGeneration> model_;
};

TEST(ToolRequestTest, ExpandsTheMaskAlongsideThePads) {
  const int64_t pad = kImagePad;
  std::vector<Tokens> mask = {{1, 1, 1}, {0, 1, 1, 1}};
  auto out = trainer::ExpandImagePads({{1, pad, 2}, {0, pad, pad, 3}}, {3, 2}, pad, &mask);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0], (Tokens{1, pad, pad, pad, 2}));
  EXPECT_EQ(mask[0], (Tokens{1, 1, 1, 1, 1}));
  EXPECT_EQ((*out)[1], (Tokens{0, pad, pad, 3}));
  EXPECT_EQ(mask[1], (Tokens{0, 1, 1, 1}));
}

// The real binary: a PNG next to the request file with a single <|image_pad|>, a second row
// left-padded under attention_mask. Its logits are the model's on the processed image, the pad
// expanded; the same file runs through `generate`.
TEST_F(ForwardToolTest, TrainerForwardVerbReadsTheRequestFileAndItsImages) {
  data::RgbImage image{56, 56, {}};
  for (int i = 0; i < 56 * 56 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>(i * 37 % 251));
  auto png = data::EncodePng(image);
  ASSERT_TRUE(png.ok());
  dir_.Write("req/cat.png", *png);
  const Tokens row0 = {20, 21, kVisionStart, kImagePad, kVisionEnd, 22};  // 9 tokens expanded
  const Tokens row1 = {0, 0, 0, 10, 11, 12, 13, 14, 15};
  const Tokens mask1 = {0, 0, 0, 1, 1, 1, 1, 1, 1};
  const std::string request =
      dir_.Write("req/request.json", nlohmann::json{{"input_ids", {row0, row1}},
                                                    {"attention_mask", {Tokens(6, 1), mask1}},
                                                    {"images", {"cat.png"}}}
                                         .dump());
  const std::string out = dir_.path() + "/logits.safetensors";
  const auto run = Trainer({"forward", "--model", model_dir(), "--request", request, "--out", out});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const torch::Tensor logits = ReadLogits(out);
  ASSERT_TRUE(logits.defined());
  ASSERT_EQ(logits.sizes(), torch::IntArrayRef({2, 9, 151936}));

  auto processed = data::PreprocessImage(image);
  ASSERT_TRUE(processed.ok());
  ASSERT_EQ(processed->num_merged_tokens(), 4);
  const torch::Tensor pixels =
      torch::from_blob(processed->pixel_values.data(), {processed->num_patches(), 1176}).clone();
  const torch::Tensor grid =
      Grid({{processed->grid_thw[0], processed->grid_thw[1], processed->grid_thw[2]}});
  torch::NoGradGuard no_grad;
  const torch::Tensor expected =
      model_->forward({Ids({Concat({{20, 21}, ImageTokens(4), {22}}), row1}),
                       Ids({Tokens(9, 1), mask1}), pixels, grid});
  EXPECT_TRUE(torch::allclose(logits, expected, 1e-4, 1e-4))
      << (logits - expected).abs().max().item<float>();
  const torch::Tensor without_image =
      model_->forward({Ids({Concat({{20, 21}, ImageTokens(4), {22}})}), {}, {}, {}});
  EXPECT_FALSE(torch::allclose(logits[0], without_image[0], 1e-3, 1e-3))
      << "the picture changes the logits";

  const auto generate = Trainer({"generate", "--model", model_dir(), "--request", request,
                                 "--max_new_tokens", "2", "--out", dir_.path() + "/gen.json"});
  EXPECT_EQ(generate.exit_code, 0) << "generate reads the same file: " << generate.err;
}

TEST_F(ForwardToolTest, TrainerForwardVerbNamesWhatIsWrong) {
  const std::string out = dir_.path() + "/logits.safetensors";
  const auto inline_json = Trainer(
      {"forward", "--model", model_dir(), "--request", R"({"input_ids": [[1, 2]]})", "--out", out});
  EXPECT_EQ(inline_json.exit_code, 1);
  EXPECT_NE(inline_json.err.find("not inline JSON"), std::string::npos) << inline_json.err;

  const std::string ragged = dir_.Write("ragged.json", R"({"input_ids": [[1, 2], [3]]})");
  const auto uneven =
      Trainer({"forward", "--model", model_dir(), "--request", ragged, "--out", out});
  EXPECT_EQ(uneven.exit_code, 1);
  EXPECT_NE(uneven.err.find("input_ids: row 1 has 1 tokens, row 0 has 2"), std::string::npos)
      << uneven.err;
  EXPECT_NE(uneven.err.find("attention_mask"), std::string::npos) << uneven.err;

  const std::string missing = dir_.Write("missing.json", R"({"input_ids": [[1, 2]],
      "images": ["nowhere.png"]})");
  const auto no_image =
      Trainer({"forward", "--model", model_dir(), "--request", missing, "--out", out});
  EXPECT_EQ(no_image.exit_code, 1);
  EXPECT_NE(no_image.err.find("nowhere.png"), std::string::npos) << no_image.err;
}

TEST_F(ForwardToolTest, HelpPrintsTheUsageAndSucceeds) {
  for (const char* help : {"--help", "-h", "help"}) {
    const auto run = Trainer({help});
    EXPECT_EQ(run.exit_code, 0) << help << ": " << run.err;
    EXPECT_EQ(run.out.rfind("usage: trainctl-trainer train", 0), 0u) << help << ": " << run.out;
  }
  const auto verb_help = Trainer({"forward", "--help"});
  EXPECT_EQ(verb_help.exit_code, 0) << verb_help.err;
  EXPECT_NE(verb_help.out.find("trainctl-trainer forward --model DIR --request REQ.json"),
            std::string::npos);
}

// In process: pixel_values_file (already processed pixels), and requests the model rejects.
TEST_F(ForwardToolTest, PixelValuesFileAndMalformedRequests) {
  const torch::Tensor pixels = RandomPixels({{1, 2, 2}});
  ASSERT_TRUE(WriteSafetensors(dir_.path() + "/pixels.safetensors",
                               {{"pixel_values", pixels}, {"image_grid_thw", Grid({{1, 2, 2}})}})
                  .ok());
  const Tokens row = Concat({{10, 11}, ImageTokens(1), {12, 13}});  // 7 tokens
  const std::string request = dir_.Write(
      "pixels.json", nlohmann::json{{"input_ids", {row, {0, 0, 1, 2, 3, 4, 5}}},
                                    {"attention_mask", {Tokens(7, 1), {0, 0, 1, 1, 1, 1, 1}}},
                                    {"pixel_values_file", dir_.path() + "/pixels.safetensors"}}
                         .dump());
  const std::string out = dir_.path() + "/out.safetensors";
  const absl::Status run = trainer::RunForward(model_dir(), request, out);
  ASSERT_TRUE(run.ok()) << run;
  const torch::Tensor logits = ReadLogits(out);
  ASSERT_TRUE(logits.defined());
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
  torch::NoGradGuard no_grad;
  const torch::Tensor direct =
      model_->forward({Ids({row, {0, 0, 1, 2, 3, 4, 5}}),
                       Ids({Tokens(7, 1), {0, 0, 1, 1, 1, 1, 1}}), pixels, Grid({{1, 2, 2}})});
  EXPECT_TRUE(torch::allclose(logits, direct, 1e-5, 1e-6));

  const absl::Status no_ids =
      trainer::RunForward(model_dir(), dir_.Write("no_ids.json", R"({"ids": [[1]]})"), out);
  EXPECT_NE(no_ids.message().find("input_ids"), std::string::npos) << no_ids;
  const absl::Status out_of_range = trainer::RunForward(
      model_dir(), dir_.Write("range.json", R"({"input_ids": [[1, 999999]]})"), out);
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument) << out_of_range;
  EXPECT_NE(out_of_range.message().find("input_ids"), std::string::npos) << out_of_range;
  const absl::Status unreadable =
      trainer::RunForward(model_dir(), dir_.path() + "/absent.json", out);
  EXPECT_EQ(unreadable.code(), absl::StatusCode::kNotFound) << unreadable;
}

}  // namespace
}  // namespace trainctl::model
