// The trainer on a CUDA device: fused attention against eager, the CUDA forward against the CPU
// one, bf16 autocast training, and a one-rank NCCL process group through Comm. Built by every
// build (so CPU CI compiles it); registered with CTest and run only in CUDA builds
// (scripts/gpu-check.sh runs it on the GPU machine).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/model/model_test_util.h"
#include "tests/testing/subprocess.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/stages/internal/autocast.h"
#include "worker/trainer/zero/comm.h"

namespace trainctl {
namespace {

using model::AttentionImpl;
using model::ModelInputs;
using model::Qwen2VLForConditionalGeneration;
using model::testing::Concat;
using model::testing::Grid;
using model::testing::Ids;
using model::testing::ImageTokens;
using model::testing::RandomPixels;
using model::testing::TinyConfig;

const torch::Device kCuda(torch::kCUDA, 0);

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(torch::cuda::is_available()) << "these tests need a CUDA device and a CUDA build";
    // Exact fp32 comparisons: no TF32 in matmuls.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
};

// Two sequences, the first left-padded by 3, the second with a (1, 4, 6) image: 6 merged tokens.
ModelInputs PaddedImageBatch() {
  const std::vector<int64_t> text = {9707, 11, 1879, 0, 220, 16, 17, 18, 19, 20, 21, 22, 23};
  std::vector<int64_t> a = Concat({{151643, 151643, 151643}, text, {24, 25, 26, 27, 28, 29, 30}});
  std::vector<int64_t> b = Concat({{40, 41}, ImageTokens(6), text});
  EXPECT_EQ(a.size(), b.size());
  ModelInputs in;
  in.input_ids = Ids({a, b});
  std::vector<int64_t> mask_a(a.size(), 1), mask_b(b.size(), 1);
  mask_a[0] = mask_a[1] = mask_a[2] = 0;
  in.attention_mask = Ids({mask_a, mask_b});
  in.pixel_values = RandomPixels({{1, 4, 6}});
  in.image_grid_thw = Grid({{1, 4, 6}});
  return in;
}

// max |a - b| over the positions attention_mask marks as tokens, relative to max |b| there.
double MaxRelDiff(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
  const torch::Tensor keep = mask.to(torch::kCPU).ne(0);
  const torch::Tensor x = a.to(torch::kCPU, torch::kFloat32).index({keep});
  const torch::Tensor y = b.to(torch::kCPU, torch::kFloat32).index({keep});
  return (x - y).abs().max().item<double>() / y.abs().max().item<double>();
}

std::shared_ptr<Qwen2VLForConditionalGeneration> TinyModel(torch::ScalarType dtype,
                                                           const torch::Device& device) {
  torch::manual_seed(7);
  auto net = std::make_shared<Qwen2VLForConditionalGeneration>(TinyConfig());
  net->to(device, dtype);
  net->eval();
  return net;
}

TEST_F(GpuTest, FusedAttentionMatchesEagerInFp32AndBf16) {
  ASSERT_TRUE(model::FusedAttentionAvailable());
  torch::NoGradGuard no_grad;
  const ModelInputs in = PaddedImageBatch();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto net = TinyModel(dtype, kCuda);
    net->SetAttentionImpl(AttentionImpl::kEager);
    const torch::Tensor eager = net->forward(in);
    net->SetAttentionImpl(AttentionImpl::kSdpa);
    const torch::Tensor fused = net->forward(in);
    const double rel = MaxRelDiff(fused, eager, in.attention_mask);
    std::cout << "fused vs eager, " << dtype << ": max rel diff " << rel << "\n";
    EXPECT_LT(rel, dtype == torch::kFloat32 ? 1e-5 : 2e-2) << dtype;
  }
}

TEST_F(GpuTest, CudaForwardMatchesCpuInFp32) {
  torch::NoGradGuard no_grad;
  const ModelInputs in = PaddedImageBatch();
  auto cpu = TinyModel(torch::kFloat32, torch::kCPU);
  const torch::Tensor expected = cpu->forward(in);
  auto gpu = TinyModel(torch::kFloat32, kCuda);
  for (const auto impl : {AttentionImpl::kEager, AttentionImpl::kSdpa}) {
    gpu->SetAttentionImpl(impl);
    const double rel = MaxRelDiff(gpu->forward(in), expected, in.attention_mask);
    std::cout << "cuda (" << model::AttentionImplName(impl) << ") vs cpu: max rel diff " << rel
              << "\n";
    EXPECT_LT(rel, 1e-5) << model::AttentionImplName(impl);
  }
}

TEST_F(GpuTest, Bf16AutocastTrainingStepHasFiniteGradients) {
  torch::manual_seed(7);
  auto net = std::make_shared<Qwen2VLForConditionalGeneration>(TinyConfig());
  net->to(kCuda);
  net->train();
  const ModelInputs in = PaddedImageBatch();
  torch::Tensor loss;
  {
    trainer::internal::AutocastGuard autocast(true, torch::kCUDA, torch::kBFloat16);
    const torch::Tensor logits = net->forward(in);
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    const torch::Tensor ids = in.input_ids.to(kCuda);
    loss = torch::nn::functional::cross_entropy(
        logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}).to(torch::kFloat32),
        ids.slice(1, 1).reshape({-1}));
  }
  loss.backward();
  double norm2 = 0;
  for (const auto& p : net->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    ASSERT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
    norm2 += p.grad().pow(2).sum().item<double>();
  }
  EXPECT_GT(norm2, 0);
  EXPECT_NEAR(loss.item<double>(), std::log(static_cast<double>(TinyConfig().vocab_size)), 1.0);
}

TEST_F(GpuTest, OneRankNcclGroupRunsEveryCollective) {
  zero::CommOptions options;
  options.device = kCuda;
  options.group_when_alone = true;
  options.master_port = testing::FreeLoopbackPort();
  options.timeout = std::chrono::seconds(60);
  auto comm = zero::Comm::Create(options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend(), "nccl");
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto opts = torch::TensorOptions().dtype(dtype).device(kCuda);
    const torch::Tensor shard = torch::arange(1000, opts);
    torch::Tensor gathered = torch::empty({1000}, opts);
    (*comm)->AllGather(shard, gathered, "test").Wait();
    EXPECT_TRUE(gathered.equal(shard));
    torch::Tensor in = torch::full({1000}, 3, opts);
    torch::Tensor out = torch::empty({1000}, opts);
    (*comm)->ReduceScatter(in, out, "test").Wait();
    EXPECT_TRUE(out.equal(torch::full({1000}, 3, opts)));
    torch::Tensor t = torch::full({17}, 2, opts);
    (*comm)->AllReduce(t, "test").Wait();
    EXPECT_TRUE(t.equal(torch::full({17}, 2, opts)));
    (*comm)->Broadcast(t, 0, "test").Wait();
    (*comm)->Barrier("test");
  }
  // Host tensors (the trainer's token counts and losses) go through the device for NCCL.
  torch::Tensor host = torch::tensor({1.5, 2.5}, torch::kFloat64);
  (*comm)->AllReduce(host, "host").Wait();
  (*comm)->Broadcast(host, 0, "host").Wait();
  EXPECT_FALSE(host.is_cuda());
  EXPECT_TRUE(host.equal(torch::tensor({1.5, 2.5}, torch::kFloat64)));
  EXPECT_GT((*comm)->bytes_sent(), 0u);
}

}  // namespace
}  // namespace trainctl
