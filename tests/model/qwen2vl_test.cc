// The model itself on the tiny config: HF's parameter names, get_rope_index, the vision tower,
// forward properties (causality, padding), units and gradient checkpointing.
#include "worker/trainer/model/qwen2vl.h"

#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <map>
#include <string>
#include <vector>

#include "tests/model/model_test_util.h"
#include "worker/trainer/model/attention.h"

namespace trainctl::model {
namespace {

using ::testing::HasSubstr;
using ::trainctl::model::testing::Concat;
using ::trainctl::model::testing::Grid;
using ::trainctl::model::testing::Ids;
using ::trainctl::model::testing::ImageTokens;
using ::trainctl::model::testing::LossAndGrads;
using ::trainctl::model::testing::RandomPixels;
using ::trainctl::model::testing::TinyConfig;

// HF's Qwen2VLForConditionalGeneration keys, in its order, written out from the architecture.
std::vector<std::string> ExpectedHfKeys(int64_t vision_depth, int64_t layers, bool tied) {
  std::vector<std::string> keys = {"visual.patch_embed.proj.weight"};
  for (int64_t b = 0; b < vision_depth; ++b) {
    const std::string p = "visual.blocks." + std::to_string(b) + ".";
    for (const char* s : {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                          "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                          "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"}) {
      keys.push_back(p + s);
    }
  }
  for (const char* s :
       {"visual.merger.ln_q.weight", "visual.merger.ln_q.bias", "visual.merger.mlp.0.weight",
        "visual.merger.mlp.0.bias", "visual.merger.mlp.2.weight", "visual.merger.mlp.2.bias"}) {
    keys.push_back(s);
  }
  testing::AppendTextKeys(layers, tied, &keys);
  return keys;
}

std::vector<std::string> Keys(const torch::nn::Module& module) {
  std::vector<std::string> out;
  for (const auto& item : module.named_parameters()) out.push_back(item.key());
  return out;
}

std::map<std::string, std::vector<int64_t>> Shapes(const torch::nn::Module& module) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().sizes().vec();
  return out;
}

TEST(Qwen2VLTest, ParameterNamesAreHfKeys) {
  const Qwen2VLConfig config = TinyConfig();
  Qwen2VLForConditionalGeneration model(config);
  EXPECT_EQ(Keys(model), ExpectedHfKeys(2, 2, /*tied=*/true));

  const auto shapes = Shapes(model);
  using V = std::vector<int64_t>;
  EXPECT_EQ(shapes.at("visual.patch_embed.proj.weight"), (V{32, 3, 2, 14, 14}));
  EXPECT_EQ(shapes.at("visual.blocks.0.attn.qkv.weight"), (V{96, 32}));
  EXPECT_EQ(shapes.at("visual.blocks.1.mlp.fc1.weight"), (V{64, 32}));
  EXPECT_EQ(shapes.at("visual.merger.mlp.0.weight"), (V{128, 128}));
  EXPECT_EQ(shapes.at("visual.merger.mlp.2.weight"), (V{64, 128}));
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (V{151936, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.weight"), (V{64, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.weight"), (V{32, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.v_proj.bias"), (V{32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.gate_proj.weight"), (V{128, 64}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.down_proj.weight"), (V{64, 128}));

  Qwen2VLConfig untied = config;
  untied.tie_word_embeddings = false;
  Qwen2VLForConditionalGeneration untied_model(untied);
  EXPECT_EQ(Keys(untied_model), ExpectedHfKeys(2, 2, /*tied=*/false));
  EXPECT_EQ(Shapes(untied_model).at("lm_head.weight"), (V{151936, 64}));
}

TEST(Qwen2VLTest, UnitsPartitionTheParameters) {
  Qwen2VLForConditionalGeneration model(TinyConfig());
  std::vector<std::string> names, owned;
  for (const ModelUnit& unit : model.Units()) {
    names.push_back(unit.name);
    for (const auto& [name, tensor] : unit.NamedParameters()) owned.push_back(name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"model.embed_tokens", "visual.patch_embed",
                                             "visual.blocks.0", "visual.blocks.1", "visual.merger",
                                             "model.layers.0", "model.layers.1", "head"}));
  std::vector<std::string> all = Keys(model);
  std::sort(all.begin(), all.end());
  std::sort(owned.begin(), owned.end());
  EXPECT_EQ(owned, all);
  EXPECT_EQ(model.Units().back().borrowed, std::vector<std::string>{"model.embed_tokens.weight"});
}

// Text + one image of grid (1, 4, 6) = 2 x 3 merged patches, then text; positions as HF's
// get_rope_index gives them, worked out by hand.
TEST(GetRopeIndexTest, HandCheckedImage) {
  const Qwen2VLConfig config = TinyConfig();
  const auto row = Concat({{10, 11}, ImageTokens(6), {12}});
  ASSERT_EQ(row.size(), 11u);
  const torch::Tensor pos = GetRopeIndex(config, Ids({row}), Grid({{1, 4, 6}}), {});
  ASSERT_EQ(pos.sizes(), torch::IntArrayRef({3, 1, 11}));
  // tokens: t0 t1 <vs> p p p p p p <ve> t2
  EXPECT_TRUE(torch::equal(pos[0][0], Ids({{0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7}})[0]));
  EXPECT_TRUE(torch::equal(pos[1][0], Ids({{0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7}})[0]));
  EXPECT_TRUE(torch::equal(pos[2][0], Ids({{0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7}})[0]));
}

TEST(GetRopeIndexTest, LeftPaddingAndImagesAcrossRows) {
  const Qwen2VLConfig config = TinyConfig();
  // Row 0: pad, t, image of grid (1, 2, 2) = 1 merged patch, t.
  // Row 1: pad, t, image of grid (1, 2, 4) = 1 x 2 merged patches: the second grid row.
  const auto row0 = Concat({{0, 10}, ImageTokens(1), {11}});
  const auto row1 = Concat({{0, 10}, ImageTokens(2)});
  const torch::Tensor ids = Ids({row0, row1});
  const torch::Tensor mask = Ids({{0, 1, 1, 1, 1, 1}, {0, 1, 1, 1, 1, 1}});
  const torch::Tensor pos = GetRopeIndex(config, ids, Grid({{1, 2, 2}, {1, 2, 4}}), mask);
  for (int axis = 0; axis < 3; ++axis) {
    EXPECT_TRUE(torch::equal(pos[axis][0], Ids({{1, 0, 1, 2, 3, 4}})[0])) << axis;
  }
  EXPECT_TRUE(torch::equal(pos[0][1], Ids({{1, 0, 1, 2, 2, 4}})[0]));  // t
  EXPECT_TRUE(torch::equal(pos[1][1], Ids({{1, 0, 1, 2, 2, 4}})[0]));  // h
  EXPECT_TRUE(torch::equal(pos[2][1], Ids({{1, 0, 1, 2, 3, 4}})[0]));  // w

  // Without images: cumsum of the mask minus one, padding at 1.
  const torch::Tensor text = GetRopeIndex(config, ids, {}, mask);
  EXPECT_TRUE(torch::equal(text[2], Ids({{1, 0, 1, 2, 3, 4}, {1, 0, 1, 2, 3, 4}})));
}

TEST(GetRopeIndexTest, PadsRunningPastTheEndAreAnError) {
  const Qwen2VLConfig config = TinyConfig();
  const auto row = Concat({{10, ::trainctl::model::testing::kVisionStart},
                           std::vector<int64_t>(5, ::trainctl::model::testing::kImagePad)});
  EXPECT_THROW(GetRopeIndex(config, Ids({row}), Grid({{1, 4, 6}}), {}), c10::Error);
  // More images in the text than rows in the grid.
  const auto two = Concat({ImageTokens(1), ImageTokens(1)});
  EXPECT_THROW(GetRopeIndex(config, Ids({two}), Grid({{1, 2, 2}}), {}), c10::Error);
}

TEST(VisionTest, OutputShapeAndAttentionIsolation) {
  torch::manual_seed(0);
  Qwen2VLForConditionalGeneration model(TinyConfig());
  model.eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor grid = Grid({{1, 4, 6}, {1, 2, 2}});
  torch::Tensor pixels = RandomPixels({{1, 4, 6}, {1, 2, 2}});
  const torch::Tensor features = model.EncodeImages(pixels, grid);
  ASSERT_EQ(features.sizes(), torch::IntArrayRef({7, 64}));

  torch::Tensor changed = pixels.clone();
  changed.narrow(0, 24, 4).add_(1.0);
  const torch::Tensor features2 = model.EncodeImages(changed, grid);
  EXPECT_TRUE(torch::allclose(features.narrow(0, 0, 6), features2.narrow(0, 0, 6), 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(features.narrow(0, 6, 1), features2.narrow(0, 6, 1)));

  // The first image alone encodes the same as inside the pair.
  const torch::Tensor alone = model.EncodeImages(pixels.narrow(0, 0, 24), Grid({{1, 4, 6}}));
  EXPECT_TRUE(torch::allclose(alone, features.narrow(0, 0, 6), 1e-5, 1e-6));

  // The plain vision forward agrees with the unit-by-unit one.
  EXPECT_TRUE(torch::allclose(model.visual->forward(pixels, grid), features, 1e-6, 1e-7));
}

TEST(VisionTest, GridThatDoesNotMatchPixelsIsAnError) {
  Qwen2VLForConditionalGeneration model(TinyConfig());
  torch::NoGradGuard no_grad;
  EXPECT_THROW(model.EncodeImages(RandomPixels({{1, 4, 6}}), Grid({{1, 4, 4}})), c10::Error);
  EXPECT_THROW(model.EncodeImages(RandomPixels({{1, 3, 6}}), Grid({{1, 3, 6}})), c10::Error);
}

class ForwardTest : public ::testing::Test {
 protected:
  ForwardTest() : model_((torch::manual_seed(1), TinyConfig())) { model_.eval(); }

  Qwen2VLForConditionalGeneration model_;
};

TEST_F(ForwardTest, LogitsShapeWithAndWithoutImages) {
  torch::NoGradGuard no_grad;
  ModelInputs text{Ids({{1, 2, 3, 4}, {5, 6, 7, 8}}), {}, {}, {}};
  const torch::Tensor logits = model_.forward(text);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({2, 4, 151936}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);

  const auto row = Concat({{10, 11}, ImageTokens(6), {12}});
  ModelInputs image{Ids({row}), {}, RandomPixels({{1, 4, 6}}), Grid({{1, 4, 6}})};
  EXPECT_EQ(model_.forward(image).sizes(), torch::IntArrayRef({1, 11, 151936}));
}

TEST_F(ForwardTest, PadFeatureMismatchIsAnError) {
  torch::NoGradGuard no_grad;
  const auto row = Concat({{10}, ImageTokens(5), {12}});
  ModelInputs bad{Ids({row}), {}, RandomPixels({{1, 4, 6}}), Grid({{1, 4, 6}})};
  const auto result = ForwardOrStatus(model_, bad);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("image tokens do not match"));
}

TEST_F(ForwardTest, IsCausal) {
  torch::NoGradGuard no_grad;
  const auto row = Concat({{10, 11}, ImageTokens(6), {12, 13, 14}});
  auto changed = row;
  changed[11] = 99;
  const torch::Tensor pixels = RandomPixels({{1, 4, 6}});
  const torch::Tensor a = model_.forward({Ids({row}), {}, pixels, Grid({{1, 4, 6}})});
  const torch::Tensor b = model_.forward({Ids({changed}), {}, pixels, Grid({{1, 4, 6}})});
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 11), b.narrow(1, 0, 11), 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 11, 1), b.narrow(1, 11, 1)));
}

TEST_F(ForwardTest, LeftPaddingGivesTheSameLogits) {
  torch::NoGradGuard no_grad;
  const auto row = Concat({{10, 11}, ImageTokens(6), {12, 13}});
  const int64_t n = static_cast<int64_t>(row.size());
  auto padded = row;
  padded.insert(padded.begin(), 3, 151643);
  std::vector<int64_t> mask(padded.size(), 1);
  mask[0] = mask[1] = mask[2] = 0;
  const torch::Tensor pixels = RandomPixels({{1, 4, 6}});

  const torch::Tensor alone = model_.forward({Ids({row}), {}, pixels, Grid({{1, 4, 6}})});
  const torch::Tensor left =
      model_.forward({Ids({padded}), Ids({mask}), pixels, Grid({{1, 4, 6}})});
  EXPECT_TRUE(torch::allclose(alone, left.narrow(1, 3, n), 1e-4, 1e-5))
      << (alone - left.narrow(1, 3, n)).abs().max();

  // A batch of a short and a long text row: the short one, left-padded, matches itself alone.
  const std::vector<int64_t> short_row = {5, 6, 7};
  const std::vector<int64_t> long_row = {8, 9, 10, 11, 12};
  const torch::Tensor batch = model_.forward(
      {Ids({{0, 0, 5, 6, 7}, long_row}), Ids({{0, 0, 1, 1, 1}, {1, 1, 1, 1, 1}}), {}, {}});
  const torch::Tensor short_alone = model_.forward({Ids({short_row}), {}, {}, {}});
  const torch::Tensor long_alone = model_.forward({Ids({long_row}), {}, {}, {}});
  EXPECT_TRUE(torch::allclose(batch[0].narrow(0, 2, 3), short_alone[0], 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(batch[1], long_alone[0], 1e-4, 1e-5));
}

TEST(AttentionTest, NamesParseAndSdpaNeedsLibTorch2) {
  EXPECT_EQ(*ParseAttentionImpl("auto"), AttentionImpl::kAuto);
  EXPECT_EQ(*ParseAttentionImpl("eager"), AttentionImpl::kEager);
  const auto sdpa = ParseAttentionImpl("sdpa");
  if (FusedAttentionAvailable()) {
    EXPECT_EQ(*sdpa, AttentionImpl::kSdpa);
  } else {
    EXPECT_EQ(sdpa.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(sdpa.status().message(), HasSubstr("LibTorch >= 2.0"));
  }
  const auto bad = ParseAttentionImpl("flash");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("got 'flash'"));
  EXPECT_EQ(ResolveAttentionImpl(AttentionImpl::kAuto, torch::kCPU), AttentionImpl::kEager);
  EXPECT_EQ(ResolveAttentionImpl(AttentionImpl::kAuto, torch::Device(torch::kCUDA, 0)),
            FusedAttentionAvailable() ? AttentionImpl::kSdpa : AttentionImpl::kEager);
}

// Grouped-query attention: 4 query heads over 2 key/value heads; causal without a mask equals
// causal with the explicit mask; every implementation this build has agrees.
TEST(AttentionTest, CausalWithoutMaskEqualsExplicitMaskInEveryImplementation) {
  torch::manual_seed(3);
  const torch::Tensor q = torch::randn({2, 4, 5, 8});
  const torch::Tensor k = torch::randn({2, 2, 5, 8});
  const torch::Tensor v = torch::randn({2, 2, 5, 8});
  const torch::Tensor causal = CausalPaddingMask({}, 2, 5, torch::kCPU);
  const torch::Tensor reference = DotProductAttention(AttentionImpl::kEager, q, k, v, causal, true);
  EXPECT_EQ(reference.sizes(), torch::IntArrayRef({2, 4, 5, 8}));
  // Query head h reads key/value head h / 2: head 1 of the output depends on kv head 0 only.
  torch::Tensor v2 = v.clone();
  v2.select(1, 1).add_(1.0);
  EXPECT_TRUE(torch::allclose(
      DotProductAttention(AttentionImpl::kEager, q, k, v2, causal, true).narrow(1, 0, 2),
      reference.narrow(1, 0, 2)));
  std::vector<AttentionImpl> impls = {AttentionImpl::kEager};
  if (FusedAttentionAvailable()) impls.push_back(AttentionImpl::kSdpa);
  for (const AttentionImpl impl : impls) {
    EXPECT_TRUE(
        torch::allclose(DotProductAttention(impl, q, k, v, {}, true), reference, 1e-5, 1e-6))
        << AttentionImplName(impl);
    EXPECT_TRUE(
        torch::allclose(DotProductAttention(impl, q, k, v, causal, true), reference, 1e-5, 1e-6))
        << AttentionImplName(impl);
  }
}

// Records the units as they run and the autograd node of each output.
class RecordingHooks : public UnitHooks {
 public:
  void BeforeUnit(const ModelUnit& unit) override { before.push_back(unit.name); }
  void AfterUnit(const ModelUnit& unit, const torch::Tensor& output) override {
    after.push_back(unit.name);
    grad_fns.push_back(output.grad_fn() ? output.grad_fn()->name() : "");
  }
  std::vector<std::string> before, after, grad_fns;
};

TEST_F(ForwardTest, HooksSeeEveryUnitInOrder) {
  RecordingHooks hooks;
  model_.SetUnitHooks(&hooks);
  torch::NoGradGuard no_grad;
  const auto row = Concat({{10}, ImageTokens(1), {12}});
  model_.forward({Ids({row}), {}, RandomPixels({{1, 2, 2}}), Grid({{1, 2, 2}})});
  model_.SetUnitHooks(nullptr);
  const std::vector<std::string> expected = {
      "model.embed_tokens", "visual.patch_embed", "visual.blocks.0", "visual.blocks.1",
      "visual.merger",      "model.layers.0",     "model.layers.1",  "head"};
  EXPECT_EQ(hooks.before, expected);
  EXPECT_EQ(hooks.after, expected);
}

LossAndGrads LossAndGradients(Qwen2VLForConditionalGeneration& model, const ModelInputs& inputs) {
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  const torch::Tensor logits = model.forward(inputs);
  const int64_t vocab = logits.size(-1);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, vocab}),
      inputs.input_ids.narrow(1, 1, inputs.input_ids.size(1) - 1).reshape({-1}));
  loss.backward();
  LossAndGrads out{loss.detach(), {}};
  for (const auto& item : model.named_parameters()) {
    out.grads[item.key()] =
        item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor();
  }
  return out;
}

TEST_F(ForwardTest, GradientCheckpointingGivesTheSameLossAndGradients) {
  model_.train();
  const auto row0 = Concat({{10, 11}, ImageTokens(6), {12, 13}});
  const auto row1 = Concat({{0, 0, 0, 0, 0, 0}, ImageTokens(1), {14, 15, 16}});
  ASSERT_EQ(row0.size(), row1.size());
  const ModelInputs inputs{
      Ids({row0, row1}),
      Ids({std::vector<int64_t>(row0.size(), 1), {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}}),
      RandomPixels({{1, 4, 6}, {1, 2, 2}}), Grid({{1, 4, 6}, {1, 2, 2}})};
  const LossAndGrads plain = LossAndGradients(model_, inputs);

  RecordingHooks hooks;
  model_.SetUnitHooks(&hooks);
  model_.SetGradientCheckpointing({/*decoder_layers=*/true, /*vision_blocks=*/true});
  const LossAndGrads checkpointed = LossAndGradients(model_, inputs);
  model_.SetGradientCheckpointing({});
  model_.SetUnitHooks(nullptr);

  // The layers and blocks really were recorded for recomputation.
  for (size_t i = 0; i < hooks.after.size(); ++i) {
    const bool recomputed = hooks.after[i].find("layers") != std::string::npos ||
                            hooks.after[i].find("blocks") != std::string::npos;
    EXPECT_EQ(hooks.grad_fns[i].find("CheckpointFunction") != std::string::npos, recomputed)
        << hooks.after[i] << ": " << hooks.grad_fns[i];
  }

  EXPECT_TRUE(torch::allclose(plain.loss, checkpointed.loss, 1e-6, 1e-7))
      << plain.loss.item<float>() << " vs " << checkpointed.loss.item<float>();
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  for (const auto& [name, grad] : plain.grads) {
    const torch::Tensor& other = checkpointed.grads.at(name);
    ASSERT_TRUE(grad.defined()) << name;
    ASSERT_TRUE(other.defined()) << name;
    EXPECT_TRUE(torch::allclose(grad, other, 1e-5, 1e-8))
        << name << " max diff " << (grad - other).abs().max().item<float>();
  }
}

// CPU autocast to bf16 while alive, as the SFT stage uses it around forward (backward runs after).
class CpuBf16Autocast {
 public:
  CpuBf16Autocast() { Set(true, at::kBFloat16); }
  ~CpuBf16Autocast() {
    Set(false, at::kBFloat16);
    at::autocast::clear_cache();
  }

 private:
  static void Set(bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCPU, enabled);
    at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
#endif
  }
};

// The recomputation in backward runs under the forward's autocast state even though backward is
// called after the autocast scope has closed.
TEST_F(ForwardTest, CheckpointingUnderAutocastMatches) {
  model_.train();
  const auto row = Concat({{10, 11}, ImageTokens(1), {12, 13, 14}});
  const ModelInputs inputs{Ids({row}), {}, RandomPixels({{1, 2, 2}}), Grid({{1, 2, 2}})};
  auto run = [&] {
    for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
    torch::Tensor logits;
    {
      CpuBf16Autocast autocast;
      logits = model_.forward(inputs);
    }
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, logits.size(-1)}).to(torch::kFloat32),
        inputs.input_ids.narrow(1, 1, inputs.input_ids.size(1) - 1).reshape({-1}));
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : model_.named_parameters())
      grads[item.key()] = item.value().grad().clone();
    return grads;
  };
  const auto plain = run();
  model_.SetGradientCheckpointing({/*decoder_layers=*/true, /*vision_blocks=*/true});
  const auto checkpointed = run();
  model_.SetGradientCheckpointing({});
  for (const auto& [name, grad] : plain) {
    EXPECT_TRUE(torch::allclose(grad, checkpointed.at(name), 1e-3, 1e-6))
        << name << " max diff " << (grad - checkpointed.at(name)).abs().max().item<float>();
  }
}

}  // namespace
}  // namespace trainctl::model
