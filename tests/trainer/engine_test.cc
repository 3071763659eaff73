// The ZeRO engine in one process (world size 1, where every collective is a local copy): stage 3's
// gather/recompute/reduce path against plain autograd, HF weights read slice by slice, and the
// fp16 loss scaler. The multi-rank behaviour is zero_test's.
#include "worker/trainer/zero/engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "tests/model/model_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::zero {
namespace {

using model::testing::Ids;
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

torch::Tensor Loss(Engine& e) {
  model::ModelInputs in;
  in.input_ids = Ids({{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}});
  const torch::Tensor logits = e.model().forward(in);
  return torch::nn::functional::cross_entropy(logits.slice(1, 0, 7).reshape({-1, logits.size(-1)}),
                                              in.input_ids.slice(1, 1).reshape({-1}));
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
  EngineOptions options;
  options.stage = 3;
  options.param_persistence_threshold = 0;
  auto e = Make(comm.get(), options);
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

TEST(EngineTest, StageThreeStepsExactlyLikeStageZero) {
  auto comm = Local();
  EngineOptions s0;
  s0.lr = 1e-2;
  s0.weight_decay = 0.1;
  s0.gradient_clipping = 0.5;
  EngineOptions s3 = s0;
  s3.stage = 3;
  s3.overlap_comm = true;
  s3.param_persistence_threshold = 1000;  // the small units stay gathered
  auto a = Make(comm.get(), s0);
  auto b = Make(comm.get(), s3);
  for (int step = 0; step < 2; ++step) {
    const torch::Tensor la = Loss(*a), lb = Loss(*b);
    EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-6) << "step " << step;
    ASSERT_TRUE(a->Backward(la).ok());
    ASSERT_TRUE(b->Backward(lb).ok());
    const StepResult ra = *a->Step(1e-2), rb = *b->Step(1e-2);
    EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-6 * ra.grad_norm);
  }
  const auto wa = a->GatherFullWeights(), wb = b->GatherFullWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    EXPECT_TRUE(torch::allclose(wa[i].second, wb[i].second, 1e-5, 1e-6)) << wa[i].first;
  }
  // Stage 3 holds no working weights between steps beyond its persistent units.
  EXPECT_LT(b->Memory().working_bytes, 4 * 1000 * 20);
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
