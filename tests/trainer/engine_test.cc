// The ZeRO engine in one process (world size 1, where every collective is a local copy): stage 3's
// gather/recompute/reduce path against plain autograd, HF weights read slice by slice, and the
// fp16 loss scaler. The multi-rank behaviour is zero_test's.
#include "worker/trainer/zero/engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "tests/model/model_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::zero {
namespace {

using model::testing::Concat;
using model::testing::Grid;
using model::testing::Ids;
using model::testing::ImageTokens;
using model::testing::RandomPixels;
using model::testing::TinyConfig;

std::unique_ptr<Comm> Local() {
  auto comm = Comm::Create(CommOptions{});
  EXPECT_TRUE(comm.ok()) << comm.status();
  return std::move(*comm);
}

std::unique_ptr<Engine> Make(Comm* comm, EngineOptions options, const std::string& weights = "") {
  auto engine = Engine::Create(TinyConfig(), options, comm, /*seed=*/5, weights);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

torch::Tensor Loss(Engine& e, const model::ModelInputs& in) {
  const torch::Tensor logits = e.model().forward(in);
  const int64_t t = in.input_ids.size(1);
  return torch::nn::functional::cross_entropy(
      logits.slice(1, 0, t - 1).reshape({-1, logits.size(-1)}),
      in.input_ids.slice(1, 1).reshape({-1}));
}

torch::Tensor Loss(Engine& e) {
  model::ModelInputs in;
  in.input_ids = Ids({{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}});
  return Loss(e, in);
}

// Stage 3 with every unit gathered and freed as it runs.
EngineOptions StageThreeWithNothingPersistent() {
  EngineOptions options;
  options.stage = 3;
  options.param_persistence_threshold = 0;
  return options;
}

// A text micro-batch and one with two images of different sizes (1 and 4 merged tokens).
std::vector<model::ModelInputs> TextAndImageBatches() {
  torch::manual_seed(3);
  model::ModelInputs text;
  text.input_ids = Ids({{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}});
  model::ModelInputs image;
  image.input_ids =
      Ids({Concat({{10, 11}, ImageTokens(1), {12, 13, 14}}), Concat({{20}, ImageTokens(4), {21}})});
  image.pixel_values = RandomPixels({{1, 2, 2}, {1, 4, 4}});
  image.image_grid_thw = Grid({{1, 2, 2}, {1, 4, 4}});
  return {text, image};
}

// A frozen engine (GRPO's reference, a reward model) forwards like the trainable one built from
// the same seed, holds no optimizer state or gradients, and refuses to train.
TEST(EngineTest, FrozenEnginesForwardAlikeWithoutOptimizerState) {
  auto comm = Local();
  for (int stage : {0, 2, 3}) {
    EngineOptions options;
    options.stage = stage;
    options.param_persistence_threshold = 1000;
    auto trained = Make(comm.get(), options);
    auto frozen = Engine::CreateFrozen(TinyConfig(), options, comm.get(), /*seed=*/5);
    ASSERT_TRUE(frozen.ok()) << frozen.status();
    Engine& f = **frozen;
    EXPECT_TRUE(f.frozen());
    const torch::Tensor expected = Loss(*trained);
    {
      torch::NoGradGuard no_grad;
      EXPECT_EQ(Loss(f).item<double>(), expected.item<double>()) << "stage " << stage;
    }
    // Grad mode on: still no graph through the frozen weights.
    EXPECT_FALSE(Loss(f).requires_grad()) << "stage " << stage;
    const MemoryStats m = f.Memory();
    EXPECT_EQ(m.optimizer_bytes, 0);
    EXPECT_EQ(m.gradient_bytes, 0);
    EXPECT_GT(trained->Memory().optimizer_bytes, 0);
    EXPECT_EQ(f.Backward(expected).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(f.Step(1e-3).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

// HoldWeights keeps every stage-3 unit gathered until the handle goes, and forwards are unchanged.
TEST(EngineTest, HeldWeightsStayGatheredUntilReleased) {
  auto comm = Local();
  auto e = Make(comm.get(), StageThreeWithNothingPersistent());
  torch::NoGradGuard no_grad;
  const double before = Loss(*e).item<double>();
  EXPECT_EQ(e->Memory().working_bytes, 0);
  {
    auto held = e->HoldWeights();
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_GT(held->bytes(), 0);
    EXPECT_EQ(e->Memory().working_bytes, held->bytes());
    EXPECT_EQ(Loss(*e).item<double>(), before);
    EXPECT_EQ(e->Memory().working_bytes, held->bytes());  // the forward freed nothing
  }
  EXPECT_EQ(e->Memory().working_bytes, 0);
}

// Stage 3 keeps each unit's activations and re-gathers only its weights for backward: it trains
// as stage 0 does (losses, gradient norms, weights) on text and image micro-batches, with and
// without gradient checkpointing, and runs each unit's forward once per micro-batch, twice for a
// checkpointed unit, so a second forward cannot come back unnoticed.
TEST(EngineTest, StageThreeRunsEachUnitOnceAndTrainsLikeStageZero) {
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "gradient checkpointing" : "no checkpointing");
    auto comm = Local();
    EngineOptions s0;
    s0.lr = 1e-2;
    s0.weight_decay = 0.1;
    s0.gradient_clipping = 0.5;
    EngineOptions s3 = s0;
    s3.stage = 3;
    s3.overlap_comm = true;
    s3.param_persistence_threshold = 1000;
    auto a = Make(comm.get(), s0);
    auto b = Make(comm.get(), s3);
    model::GradientCheckpointing ckpt;
    ckpt.decoder_layers = ckpt.vision_blocks = checkpointing;
    a->model().SetGradientCheckpointing(ckpt);
    b->model().SetGradientCheckpointing(ckpt);
    int64_t runs_per_micro_batch = 0;
    for (const model::ModelUnit& u : b->model().Units()) {
      const bool checkpointed = u.kind == model::ModelUnit::Kind::kDecoderLayer ||
                                u.kind == model::ModelUnit::Kind::kVisionBlock;
      runs_per_micro_batch += checkpointing && checkpointed ? 2 : 1;
    }
    const auto batches = TextAndImageBatches();
    for (int step = 0; step < 3; ++step) {
      for (size_t m = 0; m < batches.size(); ++m) {  // two micro-batches per step
        const int64_t before = b->unit_forward_runs();
        const torch::Tensor la = Loss(*a, batches[m]), lb = Loss(*b, batches[m]);
        EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-5 * std::abs(la.item<double>()))
            << "step " << step << " micro-batch " << m;
        ASSERT_TRUE(a->Backward(la).ok());
        ASSERT_TRUE(b->Backward(lb).ok());
        EXPECT_EQ(b->unit_forward_runs() - before, runs_per_micro_batch)
            << "step " << step << " micro-batch " << m;
      }
      const StepResult ra = *a->Step(1e-2), rb = *b->Step(1e-2);
      EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-5 * ra.grad_norm) << "step " << step;
    }
    const auto wa = a->GatherFullWeights(), wb = b->GatherFullWeights();
    ASSERT_EQ(wa.size(), wb.size());
    for (size_t i = 0; i < wa.size(); ++i) {
      // A key bias shifts all of a query's scores equally, which softmax ignores: its gradient is
      // zero up to rounding, and AdamW turns rounding noise into full steps of either sign.
      if (absl::EndsWith(wa[i].first, "k_proj.bias")) continue;
      EXPECT_TRUE(torch::allclose(wa[i].second, wb[i].second, 1e-5, 1e-6)) << wa[i].first;
    }
    EXPECT_EQ(a->unit_forward_runs(), 0);  // counted at stage 3 only
    // Stage 3 holds no working weights between steps beyond its persistent units.
    EXPECT_LT(b->Memory().working_bytes, 4 * 1000 * 20);
  }
}

// Between steps stage 3 holds only its persistent units' bytes; the forward frees each unit's
// weights as soon as it has run, though its graph keeps references to them until backward.
TEST(EngineTest, StageThreeFreesWeightsWhileActivationsWaitForBackward) {
  auto comm = Local();
  auto e = Make(comm.get(), StageThreeWithNothingPersistent());
  const torch::Tensor loss = Loss(*e);
  EXPECT_EQ(e->Memory().working_bytes, 0);
  ASSERT_TRUE(e->Backward(loss).ok());
  EXPECT_EQ(e->Memory().working_bytes, 0);
  ASSERT_TRUE(e->Step(1e-2).ok());
  EXPECT_EQ(e->Memory().working_bytes, 0);
}

TEST(EngineTest, LoadsHfWeightsSliceBySlice) {
  testing::TempDir dir;
  torch::manual_seed(11);
  model::Qwen2VLForConditionalGeneration reference(TinyConfig());
  ASSERT_TRUE(model::SaveHfCheckpoint(reference, dir.path()).ok());
  auto comm = Local();
  EngineOptions options;
  options.stage = 3;
  auto engine = Make(comm.get(), options, dir.path());
  ASSERT_NE(engine, nullptr);
  for (const auto& [name, value] : engine->GatherFullWeights()) {
    EXPECT_TRUE(torch::equal(value, reference.named_parameters()[name])) << name;
  }
  torch::NoGradGuard no_grad;
  model::ModelInputs in;
  in.input_ids = Ids({{3, 1, 4, 1, 5, 9, 2, 6}});
  EXPECT_TRUE(torch::equal(engine->model().forward(in), reference.forward(in)));
}

TEST(EngineTest, RefusesHfWeightsOfAnotherShapeNamingTheTensor) {
  testing::TempDir dir;
  model::Qwen2VLConfig other = TinyConfig();
  other.intermediate_size *= 2;
  model::Qwen2VLForConditionalGeneration wrong(other);
  ASSERT_TRUE(model::SaveHfCheckpoint(wrong, dir.path()).ok());
  auto comm = Local();
  auto engine = Engine::Create(TinyConfig(), EngineOptions{}, comm.get(), 1, dir.path());
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("model.layers.0.mlp.gate_proj.weight"),
            std::string::npos)
      << engine.status();
  EngineOptions bad;
  bad.stage = 4;
  EXPECT_EQ(Engine::Create(TinyConfig(), bad, comm.get(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, Fp16LossScalerSkipsOverflowsAndBacksOffAsDeepSpeedDoes) {
  auto comm = Local();
  EngineOptions options;
  options.fp16 = true;  // the scaler; compute stays fp32 (LibTorch has no fp16 GEMM on CPUs)
  options.initial_scale_power = 4;
  options.hysteresis = 2;
  options.loss_scale_window = 2;
  auto e = Make(comm.get(), options);
  const auto before = e->GatherFullWeights();
  auto overflow = [&] {
    EXPECT_TRUE(e->Backward(Loss(*e) * std::numeric_limits<double>::infinity()).ok());
    return *e->Step(1e-2);
  };
  StepResult r = overflow();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, 16);  // hysteresis absorbs the first
  r = overflow();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(e->SaveShards().engine["loss_scale"], 8);
  const auto after = e->GatherFullWeights();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(before[i].second, after[i].second)) << before[i].first;
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(e->Backward(Loss(*e)).ok());
    r = *e->Step(1e-2);
    EXPECT_FALSE(r.skipped);
    EXPECT_TRUE(std::isfinite(r.grad_norm));
  }
  EXPECT_EQ(e->SaveShards().engine["loss_scale"], 16);  // grown after loss_scale_window steps
}

}  // namespace
}  // namespace trainctl::zero
