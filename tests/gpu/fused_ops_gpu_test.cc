// The fused CUDA kernels (worker/trainer/model/cuda/) against LibTorch's composite ops on the
// GPU, float32, bfloat16 and float16, forward and gradients, at the decoder's shapes (the 1B
// bench's included) and odd ones; a CUDA graph capturing them; the tiny model's forward and
// backward with the fused ops on and off. Part of trainer_gpu_test (scripts/gpu-check.sh's
// gpu_test step); compiled by every build, run only in CUDA builds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/model/fused_test_util.h"
#include "tests/model/model_test_util.h"
#include "worker/trainer/model/fused_ops.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/stages/internal/autocast.h"

#ifdef TRAINCTL_CUDA_BUILD
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainctl::model {
namespace {

using testing::GradFnName;
using testing::GradTolerance;
using testing::Leaf;
using testing::MaxUlp;
using testing::Mismatch;
using testing::RelDiff;

const torch::Device kCuda(torch::kCUDA, 0);

class FusedOpsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(torch::cuda::is_available()) << "these tests need a CUDA device and a CUDA build";
    ASSERT_TRUE(FusedKernelsBuilt()) << "a CUDA build without the fused kernels";
    ASSERT_TRUE(FusedKernelsEnabled()) << "TRAINCTL_FUSED_KERNELS turned them off";
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
    torch::manual_seed(5);
  }
};

torch::Tensor Randn(at::IntArrayRef shape, torch::ScalarType dtype, double scale = 1) {
  return (torch::randn(shape, torch::TensorOptions().device(kCuda)) * scale).to(dtype);
}

TEST_F(FusedOpsGpuTest, RmsNormMatchesTheComposite) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // 64, 2048 and 3584 in 16-byte vectors (tiny, the 1B bench, Qwen2-VL-7B); 1003 element-wise.
    for (const int64_t dim : {64, 1003, 2048, 3584}) {
      for (const int64_t rows : {1, 37, 4096}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " dim " + std::to_string(dim) + " rows " +
                     std::to_string(rows));
        const torch::Tensor x0 = Randn({rows, dim}, dtype, 3);
        const torch::Tensor w0 = (1 + 0.1 * torch::randn({dim}, kCuda)).to(dtype);
        const torch::Tensor dy = Randn({rows, dim}, dtype);
        torch::Tensor x = Leaf(x0), w = Leaf(w0), xr = Leaf(x0), wr = Leaf(w0);
        const torch::Tensor out = RmsNorm(x, w, 1e-6);
        ASSERT_NE(GradFnName(out).find("RmsNormFunction"), std::string::npos) << GradFnName(out);
        const torch::Tensor ref = RmsNormComposite(xr, wr, 1e-6);
        if (dtype == torch::kFloat32) {
          EXPECT_LT(RelDiff(out, ref), 1e-6);
        } else {
          EXPECT_LE(MaxUlp(out, ref), 1);
          EXPECT_LT(Mismatch(out, ref), 0.01);
        }
        out.backward(dy);
        ref.backward(dy);
        EXPECT_LT(RelDiff(x.grad(), xr.grad()), GradTolerance(dtype));
        EXPECT_LT(RelDiff(w.grad(), wr.grad()), GradTolerance(dtype));
      }
    }
  }
}

// q and k as the projections make them ([B, T, H * D] viewed [B, H, T, D]), cos and sin
// [B or 1, T, D]; with `misaligned`, one element into a wider buffer (element-wise kernels).
TEST_F(FusedOpsGpuTest, RotaryMatchesTheComposite) {
  struct Case {
    torch::ScalarType dtype, table;
    int64_t batch, seq, q_heads, k_heads, head_dim, table_batch;
    bool misaligned;
  };
  const std::vector<Case> cases = {
      {torch::kFloat32, torch::kFloat32, 2, 7, 4, 2, 128, 2, false},
      {torch::kFloat32, torch::kFloat32, 3, 1, 4, 2, 64, 1, true},
      {torch::kBFloat16, torch::kBFloat16, 2, 512, 16, 4, 128, 2, false},  // the 1B bench's heads
      {torch::kBFloat16, torch::kBFloat16, 3, 1, 4, 2, 64, 3, false},      // one decoding step
      {torch::kBFloat16, torch::kBFloat16, 2, 9, 4, 2, 128, 1, true},
      {torch::kBFloat16, torch::kFloat32, 2, 512, 16, 4, 128, 2, false},  // autocast, fp32 tables
      {torch::kFloat16, torch::kFloat16, 2, 33, 4, 2, 16, 2, false},
      {torch::kFloat16, torch::kFloat32, 2, 33, 4, 2, 80, 2, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c10::toString(c.dtype)) + "/" + c10::toString(c.table) + " T" +
                 std::to_string(c.seq) + " D" + std::to_string(c.head_dim) +
                 (c.misaligned ? " misaligned" : ""));
    const torch::Tensor angle = torch::rand({c.table_batch, c.seq, c.head_dim}, kCuda) * 20;
    const torch::Tensor cos = angle.cos().to(c.table), sin = angle.sin().to(c.table);
    const int64_t extra = c.misaligned ? 1 : 0;
    const torch::Tensor qd = Randn({c.batch, c.seq, c.q_heads * c.head_dim + extra}, c.dtype);
    const torch::Tensor kd = Randn({c.batch, c.seq, c.k_heads * c.head_dim + extra}, c.dtype);
    auto view = [&](const torch::Tensor& buffer, int64_t heads) {
      const torch::Tensor rows = c.misaligned ? buffer.narrow(-1, 1, heads * c.head_dim) : buffer;
      return rows.view({c.batch, c.seq, heads, c.head_dim}).transpose(1, 2);
    };
    torch::Tensor qb = Leaf(qd), kb = Leaf(kd), qbr = Leaf(qd), kbr = Leaf(kd);
    const auto [q, k] = ApplyRotary(view(qb, c.q_heads), view(kb, c.k_heads), cos, sin);
    ASSERT_NE(GradFnName(q).find("RotaryFunction"), std::string::npos) << GradFnName(q);
    const auto [qr, kr] =
        ApplyRotaryComposite(view(qbr, c.q_heads), view(kbr, c.k_heads), cos, sin);
    EXPECT_EQ(q.strides(), qr.strides());
    // LibTorch's CUDA mul and add round each product and the sum as the kernel does: equal but
    // for an odd unit.
    const int64_t forward_ulp = std::max(MaxUlp(q, qr), MaxUlp(k, kr));
    EXPECT_LE(forward_ulp, 1);
    EXPECT_LT(std::max(Mismatch(q, qr), Mismatch(k, kr)), 0.01);
    const torch::Tensor gq = Randn(qr.sizes(), qr.scalar_type());
    const torch::Tensor gk = Randn(kr.sizes(), kr.scalar_type());
    torch::autograd::backward({q, k}, {gq, gk});
    torch::autograd::backward({qr, kr}, {gq, gk});
    const int64_t backward_ulp =
        std::max(MaxUlp(qb.grad(), qbr.grad()), MaxUlp(kb.grad(), kbr.grad()));
    EXPECT_LE(backward_ulp, 1);
    EXPECT_LT(std::max(Mismatch(qb.grad(), qbr.grad()), Mismatch(kb.grad(), kbr.grad())), 0.01);
    std::cout << "rotary " << c10::toString(c.dtype) << "/" << c10::toString(c.table) << " T"
              << c.seq << " D" << c.head_dim << (c.misaligned ? " misaligned" : "")
              << ": max ulp forward " << forward_ulp << ", backward " << backward_ulp << "\n";
  }
}

TEST_F(FusedOpsGpuTest, SwiGluMatchesTheComposite) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    // The 1B bench's MLP rows; a tail after whole vectors; less than one vector.
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{2, 512, 5504}, {5, 67}, {3}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(shape.back()));
      const torch::Tensor g0 = Randn(shape, dtype, 4), u0 = Randn(shape, dtype);
      const torch::Tensor dy = Randn(shape, dtype);
      torch::Tensor g = Leaf(g0), u = Leaf(u0), gr = Leaf(g0), ur = Leaf(u0);
      const torch::Tensor out = SwiGlu(g, u);
      ASSERT_NE(GradFnName(out).find("SwiGluFunction"), std::string::npos) << GradFnName(out);
      const torch::Tensor ref = SwiGluComposite(gr, ur);
      // LibTorch 2.x's CUDA silu and silu_backward compute in float32 with CUDA's expf, as the
      // kernels do: equal but for an odd unit.
      EXPECT_LE(MaxUlp(out, ref), 1);
      EXPECT_LT(Mismatch(out, ref), 0.01);
      out.backward(dy);
      ref.backward(dy);
      EXPECT_LE(MaxUlp(u.grad(), ur.grad()), 1);
      EXPECT_LT(Mismatch(u.grad(), ur.grad()), 0.01);
      EXPECT_LT(RelDiff(g.grad(), gr.grad()), GradTolerance(dtype));
    }
  }
}

#ifdef TRAINCTL_CUDA_BUILD
// No host synchronisation and no allocation outside LibTorch's allocator: the three ops are
// captured in a CUDA graph (as the decoding step is) and replay what eager runs compute.
TEST_F(FusedOpsGpuTest, TheKernelsAreCapturedInACudaGraph) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = Randn({4, 256}, torch::kBFloat16), w = Randn({256}, torch::kBFloat16);
  const torch::Tensor q = Randn({4, 1, 8, 64}, torch::kBFloat16).transpose(1, 2);
  const torch::Tensor k = Randn({4, 1, 2, 64}, torch::kBFloat16).transpose(1, 2);
  const torch::Tensor cos = Randn({4, 1, 64}, torch::kBFloat16),
                      sin = Randn({4, 1, 64}, torch::kBFloat16);
  auto step = [&] {
    const torch::Tensor h = RmsNorm(x, w, 1e-6);
    const auto [qr, kr] = ApplyRotary(q, k, cos, sin);
    return std::vector<torch::Tensor>{h, qr, kr, SwiGlu(h, h)};
  };
  const std::vector<torch::Tensor> eager = step();
  at::cuda::CUDAGraph graph;
  std::vector<torch::Tensor> captured;
  {
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(stream);
#if TORCH_VERSION_MAJOR >= 2
    graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);  // as generation.cc captures
#else
    graph.capture_begin();
#endif
    captured = step();
    graph.capture_end();
  }
  graph.replay();
  torch::cuda::synchronize();
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(captured[i].equal(eager[i])) << i;
}
#endif

// The tiny model on the GPU, fused ops on and off: float32 logits and every gradient, then a bf16
// autocast step's loss and gradients.
TEST_F(FusedOpsGpuTest, DecoderForwardAndBackwardMatchWithFusedOpsOnAndOff) {
  ModelInputs in = testing::PaddedBatchWithImage();

  torch::manual_seed(3);
  Qwen2VLForConditionalGeneration net(testing::TinyConfig());
  net.to(kCuda);
  net.train();
  const torch::Tensor ids = in.input_ids.to(kCuda);
  for (const bool autocast : {false, true}) {
    auto run = [&](bool fused) {
      SetFusedKernelsEnabled(fused);
      net.zero_grad();
      torch::Tensor logits, loss;
      {
        trainer::internal::AutocastGuard guard(autocast, torch::kCUDA, torch::kBFloat16);
        logits = net.forward(in);
        loss = torch::nn::functional::cross_entropy(
            logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}).to(torch::kFloat32),
            ids.slice(1, 1).reshape({-1}));
      }
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : net.parameters()) grads.push_back(p.grad().clone());
      SetFusedKernelsEnabled(true);
      return std::make_tuple(logits.detach(), loss.item<double>(), grads);
    };
    const auto [fused_logits, fused_loss, fused_grads] = run(true);
    const auto [logits, loss, grads] = run(false);
    const double logit_diff = RelDiff(fused_logits, logits);
    double worst_grad = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      worst_grad = std::max(worst_grad, RelDiff(fused_grads[i], grads[i]));
    }
    std::cout << (autocast ? "bf16 autocast" : "float32") << ": loss " << fused_loss << " vs "
              << loss << ", logits max rel diff " << logit_diff << ", worst gradient " << worst_grad
              << "\n";
    EXPECT_LT(logit_diff, autocast ? 2e-2 : 1e-5);
    EXPECT_NEAR(fused_loss, loss, autocast ? 1e-2 * loss : 1e-5 * loss);
    EXPECT_LT(worst_grad, autocast ? 5e-2 : 1e-4);
  }
}

}  // namespace
}  // namespace trainctl::model
