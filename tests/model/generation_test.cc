// KV-cached generation on the tiny config: cached greedy decoding against the argmax chain of
// repeated full forwards (text, one image, two images), left-padded batches against rows alone,
// seeded sampling, eos, top-k, the completion log-probabilities, and the real
// `trainctl-trainer generate` verb on a saved tiny model.
#include "worker/trainer/model/generation.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/data/image_processor.h"
#include "nlohmann/json.hpp"
#include "tests/model/model_test_util.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/generate_tool.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::model {
namespace {

using ::trainctl::model::testing::Concat;
using ::trainctl::model::testing::Grid;
using ::trainctl::model::testing::Ids;
using ::trainctl::model::testing::ImageTokens;
using ::trainctl::model::testing::RandomPixels;
using ::trainctl::model::testing::TinyConfig;
using Tokens = std::vector<int64_t>;

// One prompt with its images (pixel_values / image_grid_thw undefined for text).
struct Prompt {
  Tokens ids;
  torch::Tensor pixels;
  torch::Tensor grid;
};

class GenerationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    model_ = std::make_shared<Qwen2VLForConditionalGeneration>(TinyConfig());
    // Larger weights than HF's 0.02 give peaked logits, so argmax chains have no near-ties.
    model_->InitWeights(0.15);
    model_->eval();
    // Two 4x4-patch images (4 merged tokens each) and three prompts: text, one image, two.
    const std::vector<std::vector<int64_t>> g1 = {{1, 4, 4}}, g2 = {{1, 4, 4}, {1, 4, 8}};
    text_ = {{10, 11, 12, 13, 14, 15, 16}, {}, {}};
    one_image_ = {Concat({{20, 21}, ImageTokens(4), {22, 23, 24}}), RandomPixels(g1), Grid(g1)};
    two_images_ = {Concat({{30}, ImageTokens(4), {31, 32}, ImageTokens(8), {33}}), RandomPixels(g2),
                   Grid(g2)};
  }

  // Greedy continuation of one prompt by repeated full forwards (no cache).
  Tokens FullForwardGreedy(const Prompt& p, int64_t steps) {
    torch::NoGradGuard no_grad;
    Tokens ids = p.ids;
    Tokens out;
    for (int64_t s = 0; s < steps; ++s) {
      ModelInputs in{Ids({ids}), torch::Tensor(), p.pixels, p.grid};
      const int64_t next = model_->forward(in).select(1, -1).argmax(-1).item<int64_t>();
      ids.push_back(next);
      out.push_back(next);
    }
    return out;
  }

  // Left-pads `prompts` into one batch; their images in row order.
  ModelInputs Batch(const std::vector<Prompt>& prompts) {
    std::vector<Tokens> rows;
    std::vector<torch::Tensor> pixels, grids;
    for (const Prompt& p : prompts) {
      rows.push_back(p.ids);
      if (p.pixels.defined()) {
        pixels.push_back(p.pixels);
        grids.push_back(p.grid);
      }
    }
    auto inputs = LeftPadPrompts(rows, /*pad_token_id=*/0);
    EXPECT_TRUE(inputs.ok()) << inputs.status();
    if (!pixels.empty()) {
      inputs->pixel_values = torch::cat(pixels);
      inputs->image_grid_thw = torch::cat(grids);
    }
    return *inputs;
  }

  GenerationOutput Run(const ModelInputs& inputs, const GenerationOptions& options) {
    auto out = Generate(*model_, inputs, options);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : GenerationOutput{};
  }

  static GenerationOptions Greedy(int64_t steps) {
    GenerationOptions options;
    options.max_new_tokens = steps;
    options.temperature = 0;
    options.pad_token_id = 0;
    return options;
  }

  std::shared_ptr<Qwen2VLForConditionalGeneration> model_;
  Prompt text_, one_image_, two_images_;
};

TEST_F(GenerationTest, CachedGreedyEqualsFullForwardChain) {
  constexpr int64_t kSteps = 8;
  for (const Prompt* p : {&text_, &one_image_, &two_images_}) {
    for (AttentionImpl impl : {AttentionImpl::kEager, AttentionImpl::kSdpa}) {
      if (impl == AttentionImpl::kSdpa && !FusedAttentionAvailable()) continue;
      model_->SetAttentionImpl(impl);
      SCOPED_TRACE(AttentionImplName(impl) + " prompt of " + std::to_string(p->ids.size()));
      const GenerationOutput out = Run(Batch({*p}), Greedy(kSteps));
      ASSERT_EQ(out.tokens.size(), 1u);
      EXPECT_EQ(out.tokens[0], FullForwardGreedy(*p, kSteps));
      EXPECT_FALSE(out.stopped[0]);
      EXPECT_EQ(out.decode_steps, kSteps - 1);
      EXPECT_EQ(out.new_tokens, kSteps);
    }
  }
}

// Counts the units run through it, as a ZeRO-3 engine would gather them.
class CountingRunner : public UnitRunner {
 public:
  torch::Tensor RunUnit(const ModelUnit& unit, const UnitFn& fn, const torch::Tensor& input,
                        bool /*checkpoint*/) override {
    ++calls[unit.name];
    return fn(input);
  }
  std::map<std::string, int> calls;
};

TEST_F(GenerationTest, EveryUnitRunsThroughTheRunnerVisionOnlyInPrefill) {
  const Tokens alone = Run(Batch({one_image_}), Greedy(4)).tokens[0];
  CountingRunner runner;
  model_->SetUnitRunner(&runner);
  const GenerationOutput out = Run(Batch({one_image_}), Greedy(4));
  model_->SetUnitRunner(nullptr);
  EXPECT_EQ(out.tokens[0], alone);
  const int forwards = static_cast<int>(out.decode_steps) + 1;
  EXPECT_EQ(forwards, 4);
  for (const char* unit : {"model.embed_tokens", "model.layers.0", "model.layers.1", "head"}) {
    EXPECT_EQ(runner.calls[unit], forwards) << unit;
  }
  for (const char* unit :
       {"visual.patch_embed", "visual.blocks.0", "visual.blocks.1", "visual.merger"}) {
    EXPECT_EQ(runner.calls[unit], 1) << unit;
  }
}

TEST_F(GenerationTest, LeftPaddedBatchEqualsRowsAlone) {
  constexpr int64_t kSteps = 6;
  const std::vector<Prompt> prompts = {text_, two_images_, {{40, 41}, {}, {}}, one_image_};
  const GenerationOutput batch = Run(Batch(prompts), Greedy(kSteps));
  ASSERT_EQ(batch.tokens.size(), prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    EXPECT_EQ(batch.tokens[r], Run(Batch({prompts[r]}), Greedy(kSteps)).tokens[0]);
  }
}

TEST_F(GenerationTest, SeededSamplingRepeatsAndSeedsDiffer) {
  GenerationOptions options = Greedy(12);
  options.temperature = 1.5;
  options.top_p = 0.95;
  options.top_k = 50;
  options.seed = 7;
  const ModelInputs inputs = Batch({text_, one_image_});
  const GenerationOutput a = Run(inputs, options);
  const GenerationOutput b = Run(inputs, options);
  EXPECT_EQ(a.tokens, b.tokens);
  options.seed = 8;
  const GenerationOutput c = Run(inputs, options);
  EXPECT_NE(a.tokens, c.tokens);
}

// Per-row seeds: a row samples the same tokens whichever rows share its batch (GRPO relies on
// it for the same rollouts on any number of ranks).
TEST_F(GenerationTest, RowSeedsMakeARowIndependentOfItsBatch) {
  GenerationOptions options = Greedy(10);
  options.temperature = 1.3;
  options.row_seeds = {41, 42};
  const GenerationOutput both = Run(Batch({text_, one_image_}), options);
  options.row_seeds = {42};
  const GenerationOutput alone = Run(Batch({one_image_}), options);
  EXPECT_EQ(both.tokens[1], alone.tokens[0]);
  options.row_seeds = {42, 42};
  const GenerationOutput twice = Run(Batch({one_image_, one_image_}), options);
  EXPECT_EQ(twice.tokens[0], twice.tokens[1]);
  options.row_seeds = {1, 2, 3};  // one per row, or none
  EXPECT_FALSE(Generate(*model_, Batch({text_, one_image_}), options).ok());
}

// A decoding step has fixed shapes (what a CUDA graph replays): it writes into the buffers the
// prefill sized for the whole generation and never reallocates them; past them it refuses.
TEST_F(GenerationTest, DecodingStepsKeepTheCacheBuffersTheyStartedWith) {
  torch::NoGradGuard no_grad;
  const ModelInputs inputs = Batch({text_, one_image_});
  KvCache cache;
  const int64_t seq = inputs.input_ids.size(1);
  (void)model_->Prefill(inputs, seq + 3, cache);
  const void* key = cache.layers[0].key.data_ptr();
  const void* mask = cache.attention_mask.data_ptr();
  const torch::Tensor ids = torch::tensor({int64_t{5}, int64_t{6}}).view({2, 1});
  for (int step = 0; step < 3; ++step) (void)model_->DecodeStep(ids, cache);
  EXPECT_EQ(cache.length, seq + 3);
  EXPECT_EQ(cache.layers[0].key.data_ptr(), key);
  EXPECT_EQ(cache.attention_mask.data_ptr(), mask);
  try {
    (void)model_->DecodeStep(ids, cache);
    ADD_FAILURE() << "a step past the capacity was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("the cache is full"), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST_F(GenerationTest, TopKOneEqualsGreedy) {
  GenerationOptions options = Greedy(8);
  const ModelInputs inputs = Batch({text_, two_images_});
  const GenerationOutput greedy = Run(inputs, options);
  options.temperature = 0.7;
  options.top_k = 1;
  options.seed = 3;
  EXPECT_EQ(Run(inputs, options).tokens, greedy.tokens);
}

TEST_F(GenerationTest, EosStopsOneRowWhileOthersContinue) {
  constexpr int64_t kSteps = 8;
  const ModelInputs inputs = Batch({text_, one_image_});
  const GenerationOutput free_run = Run(inputs, Greedy(kSteps));
  // An eos id that row 0's greedy chain produces and row 1's does not.
  const Tokens& row0 = free_run.tokens[0];
  const std::set<int64_t> row1(free_run.tokens[1].begin(), free_run.tokens[1].end());
  size_t stop = 1;
  while (stop < row0.size() && row1.count(row0[stop])) ++stop;
  ASSERT_LT(stop, row0.size()) << "no token of row 0 is absent from row 1";
  const int64_t eos = row0[stop];
  const size_t first = static_cast<size_t>(std::find(row0.begin(), row0.end(), eos) - row0.begin());

  GenerationOptions options = Greedy(kSteps);
  options.eos_token_ids = {eos, 151645};
  const GenerationOutput out = Run(inputs, options);
  EXPECT_EQ(out.tokens[0], Tokens(row0.begin(), row0.begin() + static_cast<int64_t>(first) + 1));
  EXPECT_TRUE(out.stopped[0]);
  EXPECT_EQ(out.tokens[1], free_run.tokens[1]);
  EXPECT_FALSE(out.stopped[1]);

  // Lock-step: the rank keeps stepping until told all are done, and its rows keep their tokens.
  int64_t calls = 0;
  options.all_done = [&calls](bool) { return ++calls == kSteps + 3; };
  options.max_new_tokens = kSteps;
  const GenerationOutput lock = Run(inputs, options);
  EXPECT_EQ(lock.tokens, out.tokens);
  EXPECT_EQ(lock.decode_steps, kSteps + 2);
}

// Records the batch of every head call: the prefill's, then one per decoding step.
class HeadBatchRunner : public UnitRunner {
 public:
  torch::Tensor RunUnit(const ModelUnit& unit, const UnitFn& fn, const torch::Tensor& input,
                        bool /*checkpoint*/) override {
    if (unit.name == "head") batches.push_back(input.size(0));
    return fn(input);
  }
  std::vector<int64_t> batches;
};

// On the CPU a row that finished leaves the decoding batch, and the rows that go on draw the same
// tokens as when finished rows stay, fed pad (one generator for all rows, and one per row).
TEST_F(GenerationTest, FinishedRowsLeaveTheBatchWithTheSameTokens) {
  const ModelInputs inputs = Batch({text_, one_image_, two_images_});
  for (bool per_row : {false, true}) {
    SCOPED_TRACE(per_row ? "row seeds" : "one seed");
    GenerationOptions options = Greedy(10);
    options.temperature = 1.0;
    options.seed = 5;
    if (per_row) options.row_seeds = {3, 4, 5};
    // Row 0's second token as eos: row 0 stops early, the others later.
    options.eos_token_ids = {Run(inputs, options).tokens[0][1]};
    options.compact_finished_rows = false;
    const GenerationOutput whole = Run(inputs, options);
    options.compact_finished_rows = true;
    HeadBatchRunner runner;
    model_->SetUnitRunner(&runner);
    const GenerationOutput compact = Run(inputs, options);
    model_->SetUnitRunner(nullptr);
    EXPECT_EQ(compact.tokens, whole.tokens);
    EXPECT_EQ(compact.stopped, whole.stopped);
    EXPECT_EQ(compact.decode_steps, whole.decode_steps);
    // Decoding step s runs the rows that have more than s tokens.
    std::vector<int64_t> expected = {3};
    for (int64_t step = 1; step <= whole.decode_steps; ++step) {
      expected.push_back(
          std::count_if(whole.tokens.begin(), whole.tokens.end(),
                        [step](const Tokens& t) { return static_cast<int64_t>(t.size()) > step; }));
    }
    EXPECT_EQ(runner.batches, expected);
    ASSERT_LT(expected.back(), 3) << "no row finished before the others";
  }
}

TEST_F(GenerationTest, CompletionLogProbsMatchForwardAndGreedyChoice) {
  const ModelInputs prompts = Batch({text_, one_image_});
  const GenerationOutput out = Run(prompts, Greedy(5));
  // Left-padded prompt block, right-padded completion block (row 1 cut one token short).
  const int64_t p = prompts.input_ids.size(1);
  std::vector<Tokens> ids(2), mask(2);
  for (int64_t r = 0; r < 2; ++r) {
    Tokens completion = out.tokens[static_cast<size_t>(r)];
    if (r == 1) completion.pop_back();
    const torch::Tensor row_ids = prompts.input_ids[r];
    const torch::Tensor row_mask = prompts.attention_mask[r];
    ids[r] = Tokens(row_ids.data_ptr<int64_t>(), row_ids.data_ptr<int64_t>() + p);
    mask[r] = Tokens(row_mask.data_ptr<int64_t>(), row_mask.data_ptr<int64_t>() + p);
    for (int64_t t = 0; t < 5; ++t) {
      const bool real = t < static_cast<int64_t>(completion.size());
      ids[r].push_back(real ? completion[static_cast<size_t>(t)] : 0);
      mask[r].push_back(real ? 1 : 0);
    }
  }
  ModelInputs full{Ids(ids), Ids(mask), prompts.pixel_values, prompts.image_grid_thw};
  torch::NoGradGuard no_grad;
  const torch::Tensor lp = CompletionLogProbs(*model_, full, p);
  ASSERT_EQ(lp.sizes(), (std::vector<int64_t>{2, 5}));
  const torch::Tensor reference =
      model_->forward(full).narrow(1, p - 1, 5).to(torch::kFloat32).log_softmax(-1);
  const torch::Tensor picked = reference.gather(-1, full.input_ids.narrow(1, p, 5).unsqueeze(-1));
  const torch::Tensor real = full.attention_mask.narrow(1, p, 5).to(torch::kBool);
  EXPECT_TRUE(
      torch::allclose(lp.masked_select(real), picked.squeeze(-1).masked_select(real), 1e-5, 1e-5));
  // Greedy tokens are the most likely ones under the full forward too.
  const torch::Tensor best = std::get<0>(reference.max(-1));
  EXPECT_TRUE(torch::allclose(lp.masked_select(real), best.masked_select(real), 1e-4, 1e-4));
}

TEST_F(GenerationTest, RejectsBadOptionsAndRightPadding) {
  GenerationOptions options = Greedy(0);
  EXPECT_EQ(Generate(*model_, Batch({text_}), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelInputs right{Ids({{1, 2, 3}, {4, 5, 0}}), Ids({{1, 1, 1}, {1, 1, 0}}), {}, {}};
  EXPECT_EQ(Generate(*model_, right, Greedy(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(LeftPadPrompts({{1}, {}}).ok());
}

TEST(GenerateToolTest, ExpandsSinglePadsAndChecksCounts) {
  const int64_t pad = testing::kImagePad;
  auto out = trainer::ExpandImagePads({{1, pad, 2}, {pad, pad, pad}}, {2, 3}, pad);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0], (Tokens{1, pad, pad, 2}));
  EXPECT_EQ((*out)[1], (Tokens{pad, pad, pad}));
  EXPECT_FALSE(trainer::ExpandImagePads({{pad, pad}}, {3}, pad).ok());
  EXPECT_FALSE(trainer::ExpandImagePads({{pad}}, {}, pad).ok());
  EXPECT_FALSE(trainer::ExpandImagePads({{1}}, {1}, pad).ok());
}

// The real binary on a saved tiny model, an image given as a PNG with a single <|image_pad|>, and
// ragged rows: its tokens are Generate's on the same inputs built in-process.
TEST_F(GenerationTest, TrainerGenerateVerb) {
  ::trainctl::testing::TempDir dir;
  ASSERT_TRUE(SaveHfCheckpoint(*model_, dir.path() + "/model").ok());
  dir.Write("model/generation_config.json",
            R"({"eos_token_id": [151645], "pad_token_id": 151643})");
  data::RgbImage image{56, 56, {}};
  for (int i = 0; i < 56 * 56 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>(i * 37 % 251));
  auto png = data::EncodePng(image);
  ASSERT_TRUE(png.ok());
  dir.Write("req/cat.png", *png);
  const Tokens row0 = {20, 21, testing::kVisionStart, testing::kImagePad, testing::kVisionEnd, 22};
  const Tokens row1 = {10, 11, 12, 13, 14, 15, 16, 17};
  const std::string request =
      dir.Write("req/request.json",
                nlohmann::json{{"input_ids", {row0, row1}}, {"images", {"cat.png"}}}.dump());
  const std::string out_path = dir.path() + "/out.json";
  const auto run =
      ::trainctl::testing::Run({TRAINCTL_TRAINER_BIN, "generate", "--model", dir.path() + "/model",
                                "--request", request, "--max_new_tokens", "5", "--out", out_path});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto result = nlohmann::json::parse(::trainctl::testing::ReadFileOrEmpty(out_path));

  // The same inputs in-process: the processed image, its pad expanded to 4, <|im_end|> as eos.
  auto processed = data::PreprocessImage(image);
  ASSERT_TRUE(processed.ok());
  ASSERT_EQ(processed->num_merged_tokens(), 4);
  const Prompt with_image{
      Concat({{20, 21}, ImageTokens(4), {22}}),
      torch::from_blob(processed->pixel_values.data(), {processed->num_patches(), 1176}).clone(),
      Grid({{processed->grid_thw[0], processed->grid_thw[1], processed->grid_thw[2]}})};
  GenerationOptions options = Greedy(5);
  options.eos_token_ids = {kImEndTokenId};
  const GenerationOutput expected = Run(Batch({with_image, {row1, {}, {}}}), options);
  EXPECT_EQ(result["generated"].get<std::vector<Tokens>>(), expected.tokens);

  // A malformed request fails with a message naming the field.
  const std::string bad = dir.Write("req/bad.json", R"({"input_ids": [[1, "x"]]})");
  const auto failed =
      ::trainctl::testing::Run({TRAINCTL_TRAINER_BIN, "generate", "--model", dir.path() + "/model",
                                "--request", bad, "--max_new_tokens", "2", "--out", out_path});
  EXPECT_EQ(failed.exit_code, 1);
  EXPECT_NE(failed.err.find("input_ids"), std::string::npos) << failed.err;
}

}  // namespace
}  // namespace trainctl::model
