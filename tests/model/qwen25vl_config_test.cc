// Qwen2.5-VL's config (the published 3B and 7B, the tiny registry one, HF's defaults, the errors,
// writing it back) and its vision windows against HF's get_window_index written with tensor ops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/model/qwen25vl_test_util.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/vision_window.h"

namespace trainctl::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using V = std::vector<int64_t>;
using ::trainctl::model::testing::HfWindowIndex;
using ::trainctl::model::testing::ReferenceWindows;

Qwen2VLConfig Registry(const std::string& name) {
  auto path = FindModelConfig(name);
  EXPECT_TRUE(path.ok()) << path.status();
  auto config = LoadQwen2VLConfig(*path);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

nlohmann::json RegistryJson(const std::string& name) {
  std::ifstream in(*FindModelConfig(name));
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(Qwen25ConfigTest, PublishedConfigs) {
  const Qwen2VLConfig three = Registry("Qwen/Qwen2.5-VL-3B-Instruct");
  EXPECT_EQ(three.family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(three.hidden_size, 2048);
  EXPECT_EQ(three.intermediate_size, 11008);
  EXPECT_EQ(three.num_hidden_layers, 36);
  EXPECT_EQ(three.num_attention_heads, 16);
  EXPECT_EQ(three.num_key_value_heads, 2);
  EXPECT_EQ(three.vocab_size, 151936);
  EXPECT_TRUE(three.tie_word_embeddings);
  EXPECT_EQ(three.rope_theta, 1e6);
  EXPECT_EQ(three.mrope_section, (V{16, 24, 24}));
  const Qwen2VLVisionConfig& v = three.vision;
  EXPECT_EQ(v.depth, 32);
  EXPECT_EQ(v.embed_dim, 1280);
  EXPECT_EQ(v.intermediate_size, 3420);
  EXPECT_EQ(v.mlp_hidden_dim(), 3420);
  EXPECT_EQ(v.num_heads, 16);
  EXPECT_EQ(v.hidden_size, 2048);
  EXPECT_EQ(v.in_channels, 3);
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_EQ(v.spatial_merge_size, 2);
  EXPECT_EQ(v.temporal_patch_size, 2);
  EXPECT_EQ(v.window_size, 112);
  EXPECT_EQ(v.merged_window(), 4);
  EXPECT_EQ(v.fullatt_block_indexes, (V{7, 15, 23, 31}));
  EXPECT_EQ(v.tokens_per_second, 2);
  EXPECT_EQ(v.hidden_act, "silu");
  EXPECT_TRUE(v.FullAttentionBlock(7));
  EXPECT_FALSE(v.FullAttentionBlock(8));

  const Qwen2VLConfig seven = Registry("Qwen2.5-VL-7B-Instruct");
  EXPECT_EQ(seven.family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(seven.hidden_size, 3584);
  EXPECT_EQ(seven.intermediate_size, 18944);
  EXPECT_EQ(seven.num_hidden_layers, 28);
  EXPECT_EQ(seven.num_attention_heads, 28);
  EXPECT_EQ(seven.num_key_value_heads, 4);
  EXPECT_EQ(seven.vocab_size, 152064);
  EXPECT_FALSE(seven.tie_word_embeddings);
  EXPECT_EQ(seven.vision.embed_dim, 1280);
  EXPECT_EQ(seven.vision.hidden_size, 3584);

  const Qwen2VLConfig tiny = Registry("tiny-qwen2.5-vl");
  EXPECT_EQ(tiny.family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.vision.embed_dim, 32);
  EXPECT_EQ(tiny.vision.intermediate_size, 64);
  EXPECT_EQ(tiny.vision.hidden_size, 64);
  EXPECT_EQ(tiny.vision.merged_window(), 2);
  EXPECT_EQ(tiny.vision.fullatt_block_indexes, (V{1}));
  EXPECT_EQ(tiny.vision.patch_dim(), 1176);

  // Qwen2-VL stays Qwen2-VL, every block attending over whole frames.
  const Qwen2VLConfig two = Registry("tiny");
  EXPECT_EQ(two.family(), ModelFamily::kQwen2VL);
  EXPECT_FALSE(two.vision.windowed());
  EXPECT_TRUE(two.vision.FullAttentionBlock(0));
  EXPECT_EQ(two.vision.mlp_hidden_dim(), 64);
}

TEST(Qwen25ConfigTest, FamilyFromArchitecturesAndHfDefaults) {
  // transformers' save_pretrained writes only the vision keys that differ from its defaults.
  nlohmann::json j = RegistryJson("tiny-qwen2.5-vl");
  j.erase("model_type");
  nlohmann::json& v = j["vision_config"];
  for (const char* key : {"window_size", "fullatt_block_indexes", "tokens_per_second", "hidden_act",
                          "patch_size", "spatial_merge_size", "in_chans"}) {
    v.erase(key);
  }
  v["depth"] = 32;
  auto config = ParseQwen2VLConfig(j.dump(), "saved.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(config->vision.window_size, 112);
  EXPECT_EQ(config->vision.fullatt_block_indexes, (V{7, 15, 23, 31}));
  EXPECT_EQ(config->vision.tokens_per_second, 4);
  EXPECT_EQ(config->vision.hidden_act, "silu");
  EXPECT_EQ(config->vision.patch_size, 14);

  // The newer layout: text keys under text_config.
  nlohmann::json flat = RegistryJson("tiny-qwen2.5-vl");
  nlohmann::json nested = {{"model_type", "qwen2_5_vl"},
                           {"vision_config", flat["vision_config"]},
                           {"text_config", flat}};
  nested["text_config"].erase("vision_config");
  nested["text_config"]["model_type"] = "qwen2_5_vl_text";
  auto from_nested = ParseQwen2VLConfig(nested.dump(), "nested.json");
  ASSERT_TRUE(from_nested.ok()) << from_nested.status();
  EXPECT_EQ(from_nested->family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(from_nested->hidden_size, 64);
  EXPECT_EQ(from_nested->vision.embed_dim, 32);
}

TEST(Qwen25ConfigTest, WrittenBackAsQwen25) {
  const Qwen2VLConfig tiny = Registry("tiny-qwen2.5-vl");
  const nlohmann::json out = nlohmann::json::parse(Qwen2VLConfigToJson(tiny));
  EXPECT_EQ(out["architectures"], nlohmann::json::array({"Qwen2_5_VLForConditionalGeneration"}));
  EXPECT_EQ(out["model_type"], "qwen2_5_vl");
  EXPECT_EQ(out["hidden_size"], 64);
  const nlohmann::json& v = out["vision_config"];
  EXPECT_EQ(v["hidden_size"], 32);
  EXPECT_EQ(v["intermediate_size"], 64);
  EXPECT_EQ(v["out_hidden_size"], 64);
  EXPECT_EQ(v["window_size"], 56);
  EXPECT_EQ(v["fullatt_block_indexes"], nlohmann::json::array({1}));
  EXPECT_EQ(v["tokens_per_second"], 2);
  EXPECT_EQ(v["hidden_act"], "silu");
  EXPECT_FALSE(v.contains("embed_dim"));
  EXPECT_FALSE(v.contains("mlp_ratio"));

  auto again = ParseQwen2VLConfig(out.dump(), "again.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(again->vision.embed_dim, 32);
  EXPECT_EQ(again->vision.hidden_size, 64);
  EXPECT_EQ(again->vision.window_size, 56);
  EXPECT_EQ(again->vision.fullatt_block_indexes, (V{1}));

  // Qwen2-VL is written as Qwen2-VL, with none of Qwen2.5-VL's keys.
  const nlohmann::json two = nlohmann::json::parse(Qwen2VLConfigToJson(Registry("tiny")));
  EXPECT_EQ(two["model_type"], "qwen2_vl");
  EXPECT_EQ(two["architectures"], nlohmann::json::array({"Qwen2VLForConditionalGeneration"}));
  EXPECT_EQ(two["vision_config"]["embed_dim"], 32);
  EXPECT_FALSE(two["vision_config"].contains("out_hidden_size"));
}

TEST(Qwen25ConfigTest, ErrorsNameTheKey) {
  const nlohmann::json tiny = RegistryJson("tiny-qwen2.5-vl");
  auto error = [&tiny](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = tiny;
    edit(j);
    const auto config = ParseQwen2VLConfig(j.dump(), "bad/config.json");
    EXPECT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(config.status().message());
  };
  EXPECT_THAT(
      error([](auto& j) { j["vision_config"]["window_size"] = 42; }),
      AllOf(HasSubstr("bad/config.json"), HasSubstr("vision_config.window_size"), HasSubstr("28")));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["window_size"] = 0; }),
              HasSubstr("vision_config.window_size"));
  EXPECT_THAT(error([](auto& j) {
                j["vision_config"]["fullatt_block_indexes"] = {0, 2};
              }),
              AllOf(HasSubstr("vision_config.fullatt_block_indexes"), HasSubstr("block 2")));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["fullatt_block_indexes"] = {-1}; }),
              HasSubstr("vision_config.fullatt_block_indexes"));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["fullatt_block_indexes"] = "1"; }),
              HasSubstr("vision_config.fullatt_block_indexes"));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["out_hidden_size"] = 48; }),
              AllOf(HasSubstr("vision_config.out_hidden_size"), HasSubstr("hidden_size 64")));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["intermediate_size"] = 0; }),
              HasSubstr("vision_config.intermediate_size"));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["hidden_size"] = 33; }),
              AllOf(HasSubstr("vision_config.num_heads"), HasSubstr("vision_config.hidden_size")));
  EXPECT_THAT(error([](auto& j) { j["vision_config"]["hidden_act"] = "relu6"; }),
              AllOf(HasSubstr("vision_config.hidden_act"), HasSubstr("relu6")));
  EXPECT_THAT(error([](auto& j) { j["model_type"] = "qwen3_vl"; }),
              AllOf(HasSubstr("model_type"), HasSubstr("qwen3_vl")));
  EXPECT_THAT(error([](auto& j) { j["architectures"] = {"Qwen2VLForConditionalGeneration"}; }),
              HasSubstr("architectures"));
}

// ---------------------------------------------------------------------------------------------
// Windows

TEST(VisionWindowTest, MatchesHfAndInverts) {
  Qwen2VLConfig config = Registry("tiny-qwen2.5-vl");
  const std::vector<std::vector<V>> cases = {
      {{1, 4, 4}},                         // one window exactly (HF pads a whole window more)
      {{1, 6, 10}},                        // 3 x 5 merged patches: windows cut at the edges
      {{2, 6, 4}},                         // two frames
      {{1, 2, 2}, {1, 6, 10}, {3, 4, 6}},  // several images, one of three frames
      {{1, 10, 2}, {1, 8, 8}},
  };
  for (const int64_t window_size : {56, 112, 28}) {
    config.vision.window_size = window_size;
    for (const auto& grids : cases) {
      SCOPED_TRACE(::testing::Message()
                   << "window_size " << window_size << ", first grid (" << grids[0][0] << ", "
                   << grids[0][1] << ", " << grids[0][2] << "), " << grids.size() << " images");
      std::vector<int64_t> flat;
      for (const V& g : grids) flat.insert(flat.end(), g.begin(), g.end());
      const torch::Tensor grid = torch::tensor(flat).view({static_cast<int64_t>(grids.size()), 3});
      const VisionWindows got = GetWindowIndex(config.vision, grid);
      const ReferenceWindows want = HfWindowIndex(grids, 2, 14, window_size);
      EXPECT_TRUE(torch::equal(got.index, want.index)) << got.index << want.index;
      EXPECT_EQ(got.cu_seqlens, want.cu_seqlens);
      EXPECT_TRUE(torch::equal(got.inverse, torch::argsort(want.index)));

      // Rows of merged patches go out and come back unchanged.
      const int64_t merged = got.index.size(0);
      const torch::Tensor rows = torch::randn({merged * 4, 3});
      const torch::Tensor windowed = ToWindowOrder(rows, got.index, 4);
      EXPECT_TRUE(torch::equal(windowed.view({merged, 4, 3})[1],
                               rows.view({merged, 4, 3})[got.index[1].item<int64_t>()]));
      const torch::Tensor groups = windowed.view({merged, 12});
      EXPECT_TRUE(torch::equal(FromWindowOrder(groups, got.inverse), rows.view({merged, 12})));
    }
  }
}

TEST(VisionWindowTest, HandWorkedGrid) {
  // One (1, 6, 10) image: 3 x 5 merged patches in 2 x 2 windows: widths 2, 2, 1 on the first two
  // rows, then the last row alone.
  const VisionWindows w =
      GetWindowIndex(Registry("tiny-qwen2.5-vl").vision, torch::tensor({1, 6, 10}).view({1, 3}));
  EXPECT_EQ(std::vector<int64_t>(w.index.data_ptr<int64_t>(), w.index.data_ptr<int64_t>() + 15),
            (V{0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(w.cu_seqlens, (V{0, 16, 32, 40, 48, 56, 60}));
}

}  // namespace
}  // namespace trainctl::model
