// Qwen2.5-VL on the tiny-qwen2.5-vl registry config: HF's parameter names, the windowed vision
// tower against a reference written here from HF's code (window order, RMSNorm/SwiGLU blocks with
// window or frame attention, merger, back), forwards with images, gradients, rope positions, and
// HF checkpoints in and out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/model/model_test_util.h"
#include "tests/model/qwen25vl_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::model {
namespace {

using ::testing::HasSubstr;
using ::trainctl::model::testing::Concat;
using ::trainctl::model::testing::Grid;
using ::trainctl::model::testing::HfWindowIndex;
using ::trainctl::model::testing::Ids;
using ::trainctl::model::testing::ImageTokens;
using ::trainctl::model::testing::RandomPixels;
using ::trainctl::model::testing::TinyConfig;
using ::trainctl::testing::TempDir;
using Grids = std::vector<std::vector<int64_t>>;

Qwen2VLConfig Tiny25() {
  auto config = LoadQwen2VLConfig(*FindModelConfig("tiny-qwen2.5-vl"));
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// HF's Qwen2_5_VLForConditionalGeneration keys in the published layout, in its order, written out
// from its module tree.
std::vector<std::string> ExpectedQwen25Keys(int64_t vision_depth, int64_t layers, bool tied) {
  std::vector<std::string> keys = {"visual.patch_embed.proj.weight"};
  for (int64_t b = 0; b < vision_depth; ++b) {
    const std::string p = "visual.blocks." + std::to_string(b) + ".";
    for (const char* s :
         {"norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
          "attn.proj.bias", "mlp.gate_proj.weight", "mlp.gate_proj.bias", "mlp.up_proj.weight",
          "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"}) {
      keys.push_back(p + s);
    }
  }
  for (const char* s :
       {"visual.merger.ln_q.weight", "visual.merger.mlp.0.weight", "visual.merger.mlp.0.bias",
        "visual.merger.mlp.2.weight", "visual.merger.mlp.2.bias"}) {
    keys.push_back(s);
  }
  testing::AppendTextKeys(layers, tied, &keys);
  return keys;
}

std::vector<std::string> ParameterKeys(const torch::nn::Module& module) {
  std::vector<std::string> out;
  for (const auto& item : module.named_parameters()) out.push_back(item.key());
  return out;
}

TEST(Qwen25ModelTest, ParameterNamesAreHfKeys) {
  Qwen2VLForConditionalGeneration model(Tiny25());
  EXPECT_EQ(ParameterKeys(model), ExpectedQwen25Keys(2, 2, /*tied=*/true));
  auto params = model.named_parameters();
  using V = std::vector<int64_t>;
  EXPECT_EQ(params["visual.patch_embed.proj.weight"].sizes().vec(), (V{32, 3, 2, 14, 14}));
  EXPECT_EQ(params["visual.blocks.0.norm1.weight"].sizes().vec(), (V{32}));
  EXPECT_EQ(params["visual.blocks.0.attn.qkv.weight"].sizes().vec(), (V{96, 32}));
  EXPECT_EQ(params["visual.blocks.1.mlp.gate_proj.weight"].sizes().vec(), (V{64, 32}));
  EXPECT_EQ(params["visual.blocks.1.mlp.up_proj.bias"].sizes().vec(), (V{64}));
  EXPECT_EQ(params["visual.blocks.1.mlp.down_proj.weight"].sizes().vec(), (V{32, 64}));
  EXPECT_EQ(params["visual.merger.ln_q.weight"].sizes().vec(), (V{32}));
  EXPECT_EQ(params["visual.merger.mlp.0.weight"].sizes().vec(), (V{128, 128}));
  EXPECT_EQ(params["visual.merger.mlp.2.weight"].sizes().vec(), (V{64, 128}));
  // HF's initialisation: unit RMSNorm weights, zero biases.
  EXPECT_TRUE(torch::equal(params["visual.blocks.0.norm2.weight"], torch::ones({32})));
  EXPECT_TRUE(torch::equal(params["visual.blocks.0.mlp.up_proj.bias"], torch::zeros({64})));

  Qwen2VLConfig untied = Tiny25();
  untied.tie_word_embeddings = false;
  EXPECT_EQ(ParameterKeys(Qwen2VLForConditionalGeneration(untied)),
            ExpectedQwen25Keys(2, 2, /*tied=*/false));

  // The units are Qwen2-VL's.
  std::vector<std::string> units;
  for (const ModelUnit& unit : model.Units()) units.push_back(unit.name);
  EXPECT_EQ(units, (std::vector<std::string>{"model.embed_tokens", "visual.patch_embed",
                                             "visual.blocks.0", "visual.blocks.1", "visual.merger",
                                             "model.layers.0", "model.layers.1", "head"}));
  EXPECT_FALSE(model.visual->block_list[0]->full_attention());
  EXPECT_TRUE(model.visual->block_list[1]->full_attention());
}

// ---------------------------------------------------------------------------------------------
// The vision tower against a reference written from HF's modeling_qwen2_5_vl.py

torch::Tensor RmsNormReference(const torch::Tensor& x, const torch::Tensor& weight) {
  return weight * (x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-6));
}

torch::Tensor RotateHalfReference(const torch::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

// HF's rot_pos_emb: per patch in the processor's order, h then w frequencies [N, head_dim / 2].
torch::Tensor RotaryReference(const Grids& grids, int64_t head_dim, int64_t merge) {
  std::vector<double> hs, ws;
  for (const auto& g : grids) {
    for (int64_t t = 0; t < g[0]; ++t) {
      for (int64_t bh = 0; bh < g[1] / merge; ++bh) {
        for (int64_t bw = 0; bw < g[2] / merge; ++bw) {
          for (int64_t ih = 0; ih < merge; ++ih) {
            for (int64_t iw = 0; iw < merge; ++iw) {
              hs.push_back(static_cast<double>(bh * merge + ih));
              ws.push_back(static_cast<double>(bw * merge + iw));
            }
          }
        }
      }
    }
  }
  const int64_t dim = head_dim / 2;
  const torch::Tensor inv_freq =
      1.0 / torch::pow(10000.0, torch::arange(0, dim, 2, torch::kFloat32) / dim);
  return torch::cat({torch::outer(torch::tensor(hs).to(torch::kFloat32), inv_freq),
                     torch::outer(torch::tensor(ws).to(torch::kFloat32), inv_freq)},
                    -1);
}

// Attention with one [N, N] score matrix per head, masked to the segments of `cu`.
torch::Tensor AttentionReference(const torch::Tensor& x, const std::string& prefix,
                                 torch::OrderedDict<std::string, torch::Tensor>& p,
                                 const torch::Tensor& freqs, const std::vector<int64_t>& cu,
                                 int64_t heads) {
  const int64_t n = x.size(0), e = x.size(1), d = e / heads;
  const torch::Tensor qkv =
      torch::linear(x, p[prefix + "qkv.weight"], p[prefix + "qkv.bias"]).view({n, 3, heads, d});
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  auto rotate = [&emb](const torch::Tensor& t) {
    return t * emb.cos() + RotateHalfReference(t) * emb.sin();
  };
  const torch::Tensor q = rotate(qkv.select(1, 0)), k = rotate(qkv.select(1, 1));
  const torch::Tensor v = qkv.select(1, 2);
  std::vector<int64_t> segment(n);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    for (int64_t i = cu[s]; i < cu[s + 1]; ++i) segment[i] = static_cast<int64_t>(s);
  }
  const torch::Tensor seg = torch::tensor(segment);
  const torch::Tensor same = seg.unsqueeze(1).eq(seg.unsqueeze(0));
  const torch::Tensor scores =
      torch::einsum("nhd,mhd->hnm", {q, k}) / std::sqrt(static_cast<double>(d));
  const torch::Tensor probs = scores.masked_fill(same.logical_not(), -INFINITY).softmax(-1);
  const torch::Tensor out = torch::einsum("hnm,mhd->nhd", {probs, v}).reshape({n, e});
  return torch::linear(out, p[prefix + "proj.weight"], p[prefix + "proj.bias"]);
}

// HF's Qwen2_5_VisionTransformerPretrainedModel.forward, step by step, from the parameters.
torch::Tensor VisionReference(Qwen2VLForConditionalGeneration& model, const torch::Tensor& pixels,
                              const Grids& grids) {
  const Qwen2VLVisionConfig& c = model.config().vision;
  auto p = model.named_parameters();
  const int64_t e = c.embed_dim, unit = c.spatial_merge_size * c.spatial_merge_size;
  torch::Tensor h = pixels.matmul(p["visual.patch_embed.proj.weight"].view({e, -1}).t());
  const int64_t n = h.size(0);
  torch::Tensor freqs = RotaryReference(grids, c.head_dim(), c.spatial_merge_size);
  const auto windows = HfWindowIndex(grids, c.spatial_merge_size, c.patch_size, c.window_size);
  h = h.view({n / unit, unit, e}).index({windows.index}).reshape({n, e});
  freqs = freqs.view({n / unit, unit, -1}).index({windows.index}).reshape({n, -1});
  std::vector<int64_t> frames = {0};
  for (const auto& g : grids) {
    for (int64_t t = 0; t < g[0]; ++t) frames.push_back(frames.back() + g[1] * g[2]);
  }
  for (int64_t b = 0; b < c.depth; ++b) {
    const std::string pre = "visual.blocks." + std::to_string(b) + ".";
    const bool full =
        std::count(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(), b) > 0;
    h = h + AttentionReference(RmsNormReference(h, p[pre + "norm1.weight"]), pre + "attn.", p,
                               freqs, full ? frames : windows.cu_seqlens, c.num_heads);
    const torch::Tensor x = RmsNormReference(h, p[pre + "norm2.weight"]);
    auto lin = [&](const std::string& name, const torch::Tensor& in) {
      return torch::linear(in, p[pre + "mlp." + name + ".weight"],
                           p[pre + "mlp." + name + ".bias"]);
    };
    h = h + lin("down_proj", torch::silu(lin("gate_proj", x)) * lin("up_proj", x));
  }
  torch::Tensor m = RmsNormReference(h, p["visual.merger.ln_q.weight"]).view({-1, unit * e});
  m = torch::gelu(torch::linear(m, p["visual.merger.mlp.0.weight"], p["visual.merger.mlp.0.bias"]));
  m = torch::linear(m, p["visual.merger.mlp.2.weight"], p["visual.merger.mlp.2.bias"]);
  return m.index({torch::argsort(windows.index)});
}

TEST(Qwen25VisionTest, WindowedTowerMatchesTheReference) {
  torch::manual_seed(3);
  Qwen2VLForConditionalGeneration model(Tiny25());
  model.eval();
  torch::NoGradGuard no_grad;
  // Weights far larger than HF's initial 0.02, so that attention is not near uniform and the
  // rotary angles and every mask show in the output.
  for (auto& item : model.visual->named_parameters()) item.value().normal_(0.0, 0.3);
  // Sizes whose windows need padding, one exact, one of two frames.
  for (const Grids& grids :
       {Grids{{1, 6, 10}}, Grids{{1, 6, 10}, {1, 4, 4}, {2, 4, 6}}, Grids{{1, 2, 2}, {1, 10, 6}}}) {
    SCOPED_TRACE(::testing::Message() << grids.size() << " images, first (" << grids[0][0] << ", "
                                      << grids[0][1] << ", " << grids[0][2] << ")");
    const torch::Tensor pixels = RandomPixels(grids);
    const torch::Tensor grid = Grid(grids);
    const torch::Tensor units = model.EncodeImages(pixels, grid);
    const torch::Tensor want = VisionReference(model, pixels, grids);
    ASSERT_EQ(units.sizes(), want.sizes());
    EXPECT_TRUE(torch::allclose(units, want, 1e-4, 1e-4)) << (units - want).abs().max();
    EXPECT_TRUE(torch::allclose(model.visual->forward(pixels, grid), units, 1e-6, 1e-7));
  }

  // The windows matter: the same weights with every block over whole frames differ.
  Qwen2VLConfig frames = Tiny25();
  frames.vision.fullatt_block_indexes = {0, 1};
  Qwen2VLForConditionalGeneration unwindowed(frames);
  auto params = model.named_parameters();
  for (auto& item : unwindowed.named_parameters()) item.value().copy_(params[item.key()]);
  const Grids grids = {{1, 6, 10}};
  const torch::Tensor pixels = RandomPixels(grids);
  EXPECT_FALSE(torch::allclose(unwindowed.EncodeImages(pixels, Grid(grids)),
                               model.EncodeImages(pixels, Grid(grids)), 1e-2, 1e-2));
}

TEST(Qwen25VisionTest, ImagesStayApartAndGridsAreChecked) {
  torch::manual_seed(4);
  Qwen2VLForConditionalGeneration model(Tiny25());
  torch::NoGradGuard no_grad;
  const Grids grids = {{1, 6, 10}, {1, 4, 4}};
  const torch::Tensor pixels = RandomPixels(grids);
  const torch::Tensor both = model.EncodeImages(pixels, Grid(grids));
  ASSERT_EQ(both.sizes(), torch::IntArrayRef({19, 64}));
  const torch::Tensor first = model.EncodeImages(pixels.narrow(0, 0, 60), Grid({{1, 6, 10}}));
  const torch::Tensor second = model.EncodeImages(pixels.narrow(0, 60, 16), Grid({{1, 4, 4}}));
  EXPECT_TRUE(torch::allclose(both.narrow(0, 0, 15), first, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(both.narrow(0, 15, 4), second, 1e-5, 1e-6));
  EXPECT_THROW(model.EncodeImages(RandomPixels({{1, 6, 10}}), Grid({{1, 6, 8}})), c10::Error);
  EXPECT_THROW(model.EncodeImages(RandomPixels({{1, 3, 6}}), Grid({{1, 3, 6}})), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// The whole model

class Qwen25ForwardTest : public ::testing::Test {
 protected:
  Qwen25ForwardTest() : model_((torch::manual_seed(5), Tiny25())) { model_.eval(); }

  // Text, a (1, 6, 10) image, text, a (1, 4, 4) image, text.
  static ModelInputs TwoImages() {
    const auto row = Concat({{10, 11}, ImageTokens(15), {12}, ImageTokens(4), {13, 14}});
    const Grids grids = {{1, 6, 10}, {1, 4, 4}};
    return {Ids({row}), {}, RandomPixels(grids), Grid(grids)};
  }

  Qwen2VLForConditionalGeneration model_;
};

TEST_F(Qwen25ForwardTest, FiniteLogitsOnTextAndImages) {
  torch::NoGradGuard no_grad;
  const torch::Tensor text = model_.forward({Ids({{1, 2, 3, 4}, {5, 6, 7, 8}}), {}, {}, {}});
  EXPECT_EQ(text.sizes(), torch::IntArrayRef({2, 4, 151936}));
  EXPECT_TRUE(torch::isfinite(text).all().item<bool>());

  const auto row = Concat({{10, 11}, ImageTokens(15), {12}});
  const torch::Tensor one =
      model_.forward({Ids({row}), {}, RandomPixels({{1, 6, 10}}), Grid({{1, 6, 10}})});
  EXPECT_EQ(one.sizes(), torch::IntArrayRef({1, 20, 151936}));
  EXPECT_TRUE(torch::isfinite(one).all().item<bool>());

  const ModelInputs two = TwoImages();
  const torch::Tensor logits = model_.forward(two);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({1, 28, 151936}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());

  // A pad count that does not match the features is refused as for Qwen2-VL.
  ModelInputs bad = two;
  bad.image_grid_thw = Grid({{1, 6, 10}, {1, 2, 2}});
  bad.pixel_values = RandomPixels({{1, 6, 10}, {1, 2, 2}});
  EXPECT_FALSE(ForwardOrStatus(model_, bad).ok());
}

TEST_F(Qwen25ForwardTest, GradientsFlowAndCheckpointingMatches) {
  model_.train();
  const ModelInputs inputs = TwoImages();
  auto loss_and_grads = [&] {
    for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
    const torch::Tensor logits = model_.forward(inputs);
    const int64_t t = logits.size(1);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.narrow(1, 0, t - 1).reshape({-1, logits.size(-1)}),
        inputs.input_ids.narrow(1, 1, t - 1).reshape({-1}));
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : model_.named_parameters()) grads[item.key()] = item.value().grad();
    return std::make_pair(loss.detach(), grads);
  };
  const auto [loss, grads] = loss_and_grads();
  for (const auto& [name, grad] : grads) {
    ASSERT_TRUE(grad.defined()) << name;
    EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << name;
    if (name.rfind("visual.", 0) == 0) {
      EXPECT_GT(grad.abs().sum().item<double>(), 0) << name;
    }
  }

  model_.SetGradientCheckpointing({/*decoder_layers=*/true, /*vision_blocks=*/true});
  const auto [loss2, grads2] = loss_and_grads();
  model_.SetGradientCheckpointing({});
  EXPECT_TRUE(torch::allclose(loss, loss2, 1e-6, 1e-7));
  for (const auto& [name, grad] : grads) {
    EXPECT_TRUE(torch::allclose(grad, grads2.at(name), 1e-5, 1e-8)) << name;
  }
}

TEST_F(Qwen25ForwardTest, CachedGreedyEqualsFullForwards) {
  torch::NoGradGuard no_grad;
  const ModelInputs prompt = TwoImages();
  GenerationOptions options;
  options.max_new_tokens = 4;
  options.temperature = 0;
  options.pad_token_id = 0;
  const auto out = Generate(model_, prompt, options);
  ASSERT_TRUE(out.ok()) << out.status();
  torch::Tensor ids = prompt.input_ids;
  std::vector<int64_t> want;
  for (int64_t s = 0; s < options.max_new_tokens; ++s) {
    const ModelInputs in{ids, {}, prompt.pixel_values, prompt.image_grid_thw};
    want.push_back(model_.forward(in).select(1, -1).argmax(-1).item<int64_t>());
    ids = torch::cat({ids, torch::tensor({want.back()}).view({1, 1})}, 1);
  }
  ASSERT_EQ(out->tokens.size(), 1u);
  EXPECT_EQ(out->tokens[0], want);
}

TEST(Qwen25RopeTest, ImagePositionsAsHf) {
  // A (1, 4, 6) image: as Qwen2-VL.
  const auto row = Concat({{10, 11}, ImageTokens(6), {12}});
  const torch::Tensor qwen25 = GetRopeIndex(Tiny25(), Ids({row}), Grid({{1, 4, 6}}), {});
  EXPECT_TRUE(torch::equal(qwen25, GetRopeIndex(TinyConfig(), Ids({row}), Grid({{1, 4, 6}}), {})));

  // Two frames of 1 x 2 merged patches: Qwen2.5-VL keeps t at 0 for an image (HF's time scale
  // for images is 0), Qwen2-VL counts frames; the text after resumes past the largest position.
  const auto frames = Concat({{10}, ImageTokens(4), {12}});
  const torch::Tensor a = GetRopeIndex(Tiny25(), Ids({frames}), Grid({{2, 2, 4}}), {});
  const torch::Tensor b = GetRopeIndex(TinyConfig(), Ids({frames}), Grid({{2, 2, 4}}), {});
  using V = std::vector<int64_t>;
  auto axis = [](const torch::Tensor& pos, int64_t k) {
    const torch::Tensor ids = pos[k][0].contiguous();
    return V(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  };
  EXPECT_EQ(axis(a, 0), (V{0, 1, 2, 2, 2, 2, 4, 5}));
  EXPECT_EQ(axis(a, 2), (V{0, 1, 2, 3, 2, 3, 4, 5}));
  EXPECT_EQ(axis(b, 0), (V{0, 1, 2, 2, 3, 3, 4, 5}));

  // No video input: Qwen2.5-VL refuses a video's tokens; Qwen2-VL, as before, reads them as text.
  const auto video = Concat({{10, testing::kVisionStart, 151656, 151656, testing::kVisionEnd}});
  EXPECT_THROW(GetRopeIndex(Tiny25(), Ids({video}), Grid({{1, 2, 2}}), {}), c10::Error);
  EXPECT_NO_THROW(GetRopeIndex(TinyConfig(), Ids({video}), Grid({{1, 2, 2}}), {}));
}

TEST(Qwen25CheckpointTest, SaveLoadRoundTripInBothLayouts) {
  torch::manual_seed(6);
  auto model = std::make_shared<Qwen2VLForConditionalGeneration>(Tiny25());
  model->eval();
  const auto row = Concat({{10}, ImageTokens(15), {11}, ImageTokens(4), {12}});
  const Grids grids = {{1, 6, 10}, {1, 4, 4}};
  const ModelInputs inputs{Ids({row}), {}, RandomPixels(grids), Grid(grids)};
  torch::NoGradGuard no_grad;
  const torch::Tensor want = model->forward(inputs);

  TempDir dir;
  ASSERT_TRUE(SaveHfCheckpoint(*model, dir.path()).ok());
  auto config = LoadQwen2VLConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->family(), ModelFamily::kQwen25VL);
  EXPECT_EQ(config->vision.fullatt_block_indexes, std::vector<int64_t>{1});
  auto loaded = LoadHfModel(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  (*loaded)->eval();
  EXPECT_TRUE(torch::equal((*loaded)->forward(inputs), want));

  // transformers' newer layout (model.language_model.*, model.visual.*) loads the same.
  auto file = SafetensorsFile::Open(dir.path() + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<NamedTensor> renamed;
  for (const std::string& name : (*file)->names()) {
    const std::string to =
        name.rfind("visual.", 0) == 0 ? "model." + name : "model.language_model." + name.substr(6);
    renamed.push_back({to, (*file)->Get(name)->clone()});
  }
  TempDir newer;
  ASSERT_TRUE(WriteSafetensors(newer.path() + "/model.safetensors", renamed).ok());
  torch::manual_seed(8);
  Qwen2VLForConditionalGeneration other(Tiny25());
  other.eval();
  const absl::Status status = LoadHfCheckpoint(other, newer.path());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(torch::equal(other.forward(inputs), want));

  // A Qwen2-VL checkpoint is not a Qwen2.5-VL one.
  TempDir two;
  ASSERT_TRUE(SaveHfCheckpoint(Qwen2VLForConditionalGeneration(TinyConfig()), two.path()).ok());
  const absl::Status wrong = LoadHfCheckpoint(other, two.path());
  EXPECT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.message(), HasSubstr("mlp.gate_proj"));
}

}  // namespace
}  // namespace trainctl::model
