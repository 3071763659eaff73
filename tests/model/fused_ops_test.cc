// The fused ops (worker/trainer/model/fused_ops.h) on CPU tensors: the kernels' arithmetic
// compiled for the host (fused_host_kernels.h, the very functions the .cu files run) through the
// same autograd Functions the CUDA path takes, against LibTorch's composite forms with autograd,
// forward and gradients, in float32, bfloat16 and float16, on the shapes and layouts the decoder
// makes and on odd ones; then the tiny model's decoder with the fused ops on and off.
// tests/gpu/fused_ops_gpu_test.cc runs the same comparisons on a GPU with the CUDA kernels.
#include "worker/trainer/model/fused_ops.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/model/fused_host_kernels.h"
#include "tests/model/fused_test_util.h"
#include "tests/model/model_test_util.h"
#include "worker/trainer/model/cuda/fused_math.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::model {
namespace {

using testing::HostCalls;
using testing::ScopedHostKernels;

using testing::GradFnName;
using testing::GradTolerance;
using testing::Leaf;
using testing::MaxUlp;
using testing::Mismatch;
using testing::RelDiff;

class FusedOpsTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(11); }
  ScopedHostKernels host_kernels_;
};

TEST(FusedMathTest, VectorWidthNeedsAlignedPointersAndDividingCounts) {
  alignas(16) float buffer[16] = {};
  using fused::VecWidth;
  EXPECT_EQ(VecWidth(4, {{buffer, 4}, {buffer + 4, 4}}, {8, 12}), 4);
  EXPECT_EQ(VecWidth(2, {{buffer, 2}}, {16}), 8);
  EXPECT_EQ(VecWidth(4, {{buffer + 1, 4}}, {8}), 1);  // 4-byte aligned only
  EXPECT_EQ(VecWidth(4, {{buffer, 4}}, {6}), 1);      // a row of 6 floats
  EXPECT_EQ(VecWidth(4, {{buffer, 4}, {nullptr, 4}}, {0}), 4);
  EXPECT_EQ(fused::RmsNormThreads(1), 32);
  EXPECT_EQ(fused::RmsNormThreads(256), 256);
  EXPECT_EQ(fused::RmsNormThreads(1003), 512);
}

TEST(FusedMathTest, RotaryArgumentsOutsideTheKernelsAreRefused) {
  fused::RotaryArgs a;
  a.q.heads = 16;
  a.k.heads = 4;
  a.batch = 8;
  a.seq = 2048;
  a.head_dim = 128;
  a.in_dtype = a.table_dtype = a.out_dtype = fused::DType::kBFloat16;
  EXPECT_TRUE(fused::RotaryArgsValid(a));
  a.table_dtype = fused::DType::kFloat32;  // bf16 q, float32 tables: float32 out only
  EXPECT_FALSE(fused::RotaryArgsValid(a));
  a.out_dtype = fused::DType::kFloat32;
  EXPECT_TRUE(fused::RotaryArgsValid(a));
  a.backward = true;  // backward: float32 gradients in, bf16 out
  EXPECT_FALSE(fused::RotaryArgsValid(a));
  a.in_dtype = fused::DType::kFloat32;
  a.out_dtype = fused::DType::kBFloat16;
  EXPECT_TRUE(fused::RotaryArgsValid(a));
  a.head_dim = 127;
  EXPECT_FALSE(fused::RotaryArgsValid(a));
  a.head_dim = 128;
  a.seq = 1 << 20;  // 8 * 2^20 * 20 rows * 64 pairs: past 31 bits of items
  EXPECT_FALSE(fused::RotaryArgsValid(a));
}

// ---- RMSNorm ---------------------------------------------------------------------------------

class RmsNormTest : public FusedOpsTest,
                    public ::testing::WithParamInterface<std::tuple<torch::ScalarType, int64_t>> {};

TEST_P(RmsNormTest, ForwardAndGradientsMatchTheComposite) {
  const auto [dtype, dim] = GetParam();
  for (const int64_t rows : {1, 37}) {
    const torch::Tensor x0 = torch::randn({rows, dim}).mul(3).to(dtype);
    const torch::Tensor w0 = (1 + 0.1 * torch::randn({dim})).to(dtype);
    const torch::Tensor dy = torch::randn({rows, dim}).to(dtype);
    torch::Tensor x = Leaf(x0), w = Leaf(w0), xr = Leaf(x0), wr = Leaf(w0);

    const int calls = HostCalls().rms_norm_forward;
    const torch::Tensor out = RmsNorm(x, w, 1e-6);
    EXPECT_EQ(HostCalls().rms_norm_forward, calls + 1);
    EXPECT_NE(GradFnName(out).find("RmsNormFunction"), std::string::npos) << GradFnName(out);
    const torch::Tensor ref = RmsNormComposite(xr, wr, 1e-6);
    ASSERT_EQ(out.scalar_type(), dtype);
    // float32: a few roundings apart (the sum of squares in another order); half types: the
    // same value, or one unit apart where that sum lands next to a rounding boundary, which few
    // elements do (rounding the product only, not the normalised row before it, moves many).
    if (dtype == torch::kFloat32) {
      EXPECT_LT(RelDiff(out, ref), 1e-6) << "dim " << dim << " rows " << rows;
    } else {
      EXPECT_LE(MaxUlp(out, ref), 1) << dtype << " dim " << dim << " rows " << rows;
      EXPECT_LT(Mismatch(out, ref), 0.01) << dtype << " dim " << dim << " rows " << rows;
    }

    out.backward(dy);
    ref.backward(dy);
    EXPECT_EQ(HostCalls().rms_norm_forward, calls + 1);
    EXPECT_LT(RelDiff(x.grad(), xr.grad()), GradTolerance(dtype)) << dtype << " dim " << dim;
    EXPECT_LT(RelDiff(w.grad(), wr.grad()), GradTolerance(dtype)) << dtype << " dim " << dim;
    EXPECT_EQ(x.grad().scalar_type(), dtype);
    EXPECT_EQ(w.grad().scalar_type(), dtype);
  }
}

// 64 and 2048: whole 16-byte vectors (the tiny model's hidden size, the 1B bench's); 1003: one
// element at a time, more vectors than threads.
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormTest,
                         ::testing::Combine(::testing::Values(torch::kFloat32, torch::kBFloat16,
                                                              torch::kFloat16),
                                            ::testing::Values(64, 1003, 2048)));

TEST_F(FusedOpsTest, RmsNormGradientsOnlyWhereWanted) {
  const torch::Tensor x0 = torch::randn({5, 3, 64});
  const torch::Tensor dy = torch::randn({5, 3, 64});
  torch::Tensor w = torch::ones({64}) + 0.1 * torch::randn({64});  // frozen
  torch::Tensor x = Leaf(x0), xr = Leaf(x0);
  const int backward_calls = HostCalls().rms_norm_backward;
  RmsNorm(x, w, 1e-6).backward(dy);
  RmsNormComposite(xr, w, 1e-6).backward(dy);
  EXPECT_EQ(HostCalls().rms_norm_backward, backward_calls + 1);
  EXPECT_LT(RelDiff(x.grad(), xr.grad()), 2e-6);
  EXPECT_FALSE(w.grad().defined());

  torch::Tensor w1 = Leaf(w), wr = Leaf(w);
  RmsNorm(x0, w1, 1e-6).backward(dy);  // x needs no gradient
  RmsNormComposite(x0, wr, 1e-6).backward(dy);
  EXPECT_LT(RelDiff(w1.grad(), wr.grad()), 2e-6);
}

// ---- rotary ----------------------------------------------------------------------------------

struct RotaryCase {
  torch::ScalarType dtype;
  torch::ScalarType table_dtype;
  int64_t head_dim;
  int64_t seq;
  int64_t table_batch;  // 1: one table broadcast over the batch
  bool misaligned;      // q and k one element into their buffers: no vector accesses
};

std::string CaseName(const RotaryCase& c) {
  return std::string(c10::toString(c.dtype)) + "/" + c10::toString(c.table_dtype) + " D" +
         std::to_string(c.head_dim) + " T" + std::to_string(c.seq) + " table batch " +
         std::to_string(c.table_batch) + (c.misaligned ? " misaligned" : "");
}

// q or k [B, H, T, D] as Qwen2VLAttention makes it: a transposed view of the [B, T, H * D]
// projection (the leaf, `buffer`), or with `misaligned`, of the same one element into a wider
// buffer (no 16-byte accesses then).
struct Projection {
  torch::Tensor buffer;
  torch::Tensor view;
};

Projection MakeProjection(const torch::Tensor& data, int64_t heads, int64_t head_dim,
                          bool misaligned) {
  Projection p;
  p.buffer = data.detach().clone().requires_grad_(true);
  const torch::Tensor rows = misaligned ? p.buffer.narrow(-1, 1, heads * head_dim) : p.buffer;
  p.view = rows.view({data.size(0), data.size(1), heads, head_dim}).transpose(1, 2);
  return p;
}

TEST_F(FusedOpsTest, RotaryForwardAndGradientsMatchTheComposite) {
  const std::vector<RotaryCase> cases = {
      {torch::kFloat32, torch::kFloat32, 128, 7, 3, false},
      {torch::kFloat32, torch::kFloat32, 64, 1, 1, false},
      {torch::kFloat32, torch::kFloat32, 64, 5, 3, true},
      {torch::kBFloat16, torch::kBFloat16, 128, 7, 3, false},
      {torch::kBFloat16, torch::kBFloat16, 64, 1, 3, false},
      {torch::kBFloat16, torch::kBFloat16, 128, 6, 1, true},
      {torch::kBFloat16, torch::kFloat32, 128, 7, 3, false},  // autocast: bf16 q, fp32 tables
      {torch::kBFloat16, torch::kFloat32, 64, 3, 3, true},
      {torch::kFloat16, torch::kFloat16, 128, 4, 3, false},
      {torch::kFloat16, torch::kFloat32, 16, 9, 3, false},  // the tiny model's head_dim
  };
  const int64_t batch = 3, q_heads = 4, k_heads = 2;
  for (const RotaryCase& c : cases) {
    SCOPED_TRACE(CaseName(c));
    const torch::Tensor angle = torch::rand({c.table_batch, c.seq, c.head_dim}) * 20;
    const torch::Tensor cos = angle.cos().to(c.table_dtype), sin = angle.sin().to(c.table_dtype);
    const int64_t extra = c.misaligned ? 1 : 0;
    const torch::Tensor q_data = torch::randn({batch, c.seq, q_heads * c.head_dim + extra});
    const torch::Tensor k_data = torch::randn({batch, c.seq, k_heads * c.head_dim + extra});
    const Projection q = MakeProjection(q_data.to(c.dtype), q_heads, c.head_dim, c.misaligned);
    const Projection k = MakeProjection(k_data.to(c.dtype), k_heads, c.head_dim, c.misaligned);
    const Projection qr = MakeProjection(q_data.to(c.dtype), q_heads, c.head_dim, c.misaligned);
    const Projection kr = MakeProjection(k_data.to(c.dtype), k_heads, c.head_dim, c.misaligned);

    const int calls = HostCalls().rotary_forward;
    const auto [q_out, k_out] = ApplyRotary(q.view, k.view, cos, sin);
    EXPECT_EQ(HostCalls().rotary_forward, calls + 1);
    EXPECT_NE(GradFnName(q_out).find("RotaryFunction"), std::string::npos) << GradFnName(q_out);
    const auto [q_ref, k_ref] = ApplyRotaryComposite(qr.view, kr.view, cos, sin);
    ASSERT_EQ(q_out.scalar_type(), q_ref.scalar_type());
    ASSERT_EQ(q_out.sizes(), q_ref.sizes());
    // The composite's roundings, reproduced: equal.
    EXPECT_EQ(MaxUlp(q_out, q_ref), 0);
    EXPECT_EQ(MaxUlp(k_out, k_ref), 0);

    const torch::Tensor gq = torch::randn(q_ref.sizes()).to(q_ref.scalar_type());
    const torch::Tensor gk = torch::randn(k_ref.sizes()).to(k_ref.scalar_type());
    const int backward_calls = HostCalls().rotary_backward;
    torch::autograd::backward({q_out, k_out}, {gq, gk});
    torch::autograd::backward({q_ref, k_ref}, {gq, gk});
    EXPECT_EQ(HostCalls().rotary_backward, backward_calls + 1);
    ASSERT_EQ(q.buffer.grad().scalar_type(), c.dtype);
    EXPECT_EQ(MaxUlp(q.buffer.grad(), qr.buffer.grad()), 0);
    EXPECT_EQ(MaxUlp(k.buffer.grad(), kr.buffer.grad()), 0);
  }
}

// The strided layouts themselves (not copies): q and k as the projections' transposed views, the
// results in the same layout, as the composite's are.
TEST_F(FusedOpsTest, RotaryKeepsTheProjectionsLayout) {
  const torch::Tensor angle = torch::rand({2, 5, 32}) * 20;
  const torch::Tensor cos = angle.cos(), sin = angle.sin();
  torch::Tensor qp = torch::randn({2, 5, 4 * 32}, torch::requires_grad());
  torch::Tensor kp = torch::randn({2, 5, 2 * 32}, torch::requires_grad());
  const torch::Tensor q = qp.view({2, 5, 4, 32}).transpose(1, 2);
  const torch::Tensor k = kp.view({2, 5, 2, 32}).transpose(1, 2);
  const auto [q_out, k_out] = ApplyRotary(q, k, cos, sin);
  const auto [q_ref, k_ref] = ApplyRotaryComposite(q, k, cos, sin);
  EXPECT_EQ(q_out.strides(), q_ref.strides());
  EXPECT_EQ(k_out.strides(), k_ref.strides());
  EXPECT_LE(MaxUlp(q_out, q_ref), 1);
  EXPECT_LE(MaxUlp(k_out, k_ref), 1);
  const auto grads = torch::autograd::grad({q_out.sum() + k_out.pow(2).sum()}, {qp, kp});
  const auto grads_ref = torch::autograd::grad({q_ref.sum() + k_ref.pow(2).sum()}, {qp, kp});
  EXPECT_LT(RelDiff(grads[0], grads_ref[0]), 1e-6);
  EXPECT_LT(RelDiff(grads[1], grads_ref[1]), 1e-6);
}

// ---- SwiGLU ----------------------------------------------------------------------------------

// silu and silu' as LibTorch 2.x's CUDA kernels compute them (in float32, one rounding to the
// storage type), from the same rounded operands as the composite: out = silu(gate).to(T) * up,
// grad_up = dy * silu(gate).to(T), grad_gate = silu'(gate) * (dy * up).to(T).
std::vector<torch::Tensor> SwiGluInFloat(const torch::Tensor& gate, const torch::Tensor& up,
                                         const torch::Tensor& dy) {
  const torch::ScalarType t = gate.scalar_type();
  const torch::Tensor g = gate.to(torch::kFloat32), sig = torch::sigmoid(g);
  const torch::Tensor silu = (g * sig).to(t);
  return {silu * up, dy * silu, ((dy * up).to(torch::kFloat32) * sig * (1 + g * (1 - sig))).to(t)};
}

// float16 is left to the GPU test: LibTorch 1.13 has no CPU silu for it.
TEST_F(FusedOpsTest, SwiGluForwardAndGradientsMatchTheComposite) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    // Whole vectors; a tail after them; fewer elements than one vector.
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{2, 3, 128}, {5, 67}, {3}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(shape.back()));
      const torch::Tensor g0 = (torch::randn(shape) * 4).to(dtype);
      const torch::Tensor u0 = torch::randn(shape).to(dtype);
      const torch::Tensor dy = torch::randn(shape).to(dtype);
      torch::Tensor g = Leaf(g0), u = Leaf(u0), gr = Leaf(g0), ur = Leaf(u0);
      const int calls = HostCalls().swiglu_backward;
      const torch::Tensor out = SwiGlu(g, u);
      EXPECT_NE(GradFnName(out).find("SwiGluFunction"), std::string::npos) << GradFnName(out);
      const torch::Tensor ref = SwiGluComposite(gr, ur);
      out.backward(dy);
      ref.backward(dy);
      EXPECT_EQ(HostCalls().swiglu_backward, calls + 1);
      // exp() here is the C library's, LibTorch's CPU kernels' Sleef's: silu differs by an ulp
      // of float32 at times, and a rounding to bfloat16 after it rarely. silu' crosses zero
      // (gate near -1.28), where units in the last place say nothing: the gate's gradient is
      // held to its largest value.
      const std::vector<torch::Tensor> expected = SwiGluInFloat(g0, u0, dy);
      if (dtype == torch::kFloat32) {
        EXPECT_LE(MaxUlp(out, ref), 4);
        EXPECT_LE(MaxUlp(u.grad(), ur.grad()), 4);
        EXPECT_LT(RelDiff(g.grad(), gr.grad()), GradTolerance(dtype));
      } else {
        EXPECT_LE(MaxUlp(out, expected[0]), 1);
        EXPECT_LT(Mismatch(out, expected[0]), 0.01);
        EXPECT_LE(MaxUlp(u.grad(), expected[1]), 1);
        EXPECT_LT(Mismatch(u.grad(), expected[1]), 0.01);
        EXPECT_LT(RelDiff(g.grad(), expected[2]), GradTolerance(dtype));
        // LibTorch 1.13's CPU silu and silu_backward round their intermediates to bfloat16 (its
        // CUDA kernels and 2.x's do not): a unit or two off the above, often.
        EXPECT_LE(MaxUlp(out, ref), 2);
        EXPECT_LE(MaxUlp(u.grad(), ur.grad()), 2);
        EXPECT_LT(RelDiff(g.grad(), gr.grad()), 3 * GradTolerance(dtype));
      }
    }
  }
}

// ---- the switch, the fallbacks, errors -------------------------------------------------------

TEST_F(FusedOpsTest, NoGradCallsRunTheKernelsWithoutAFunction) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({4, 64}), w = torch::randn({64});
  const int calls = HostCalls().rms_norm_forward;
  const torch::Tensor out = RmsNorm(x, w, 1e-6);
  EXPECT_EQ(HostCalls().rms_norm_forward, calls + 1);
  EXPECT_FALSE(out.grad_fn());
  EXPECT_LT(RelDiff(out, RmsNormComposite(x, w, 1e-6)), 1e-6);
}

TEST_F(FusedOpsTest, SwitchedOffOrUnsupportedRunsTheComposite) {
  const torch::Tensor x = torch::randn({4, 64}, torch::requires_grad());
  const torch::Tensor w = torch::randn({64}, torch::requires_grad());
  const int calls = HostCalls().rms_norm_forward;
  SetFusedKernelsEnabled(false);
  EXPECT_FALSE(FusedKernelsEnabled());
  const torch::Tensor off = RmsNorm(x, w, 1e-6);
  SetFusedKernelsEnabled(true);
  EXPECT_EQ(HostCalls().rms_norm_forward, calls);
  EXPECT_EQ(GradFnName(off).find("RmsNormFunction"), std::string::npos) << GradFnName(off);
  // bfloat16 x with a float32 weight (promoted to float32): not a kernel's.
  const torch::Tensor mixed = RmsNorm(x.to(torch::kBFloat16), w, 1e-6);
  EXPECT_EQ(HostCalls().rms_norm_forward, calls);
  EXPECT_EQ(mixed.scalar_type(), torch::kFloat32);
  // Non-contiguous SwiGLU inputs.
  const torch::Tensor g = torch::randn({8, 6}).t(), u = torch::randn({8, 6}).t();
  const int swiglu_calls = HostCalls().swiglu_forward;
  EXPECT_TRUE(SwiGlu(g, u).equal(SwiGluComposite(g, u)));
  EXPECT_EQ(HostCalls().swiglu_forward, swiglu_calls);
}

int FailingRmsNormForward(const fused::RmsNormForwardArgs&, void*) { return 700; }
const char* FailingStatus(int status) { return status == 700 ? "an illegal memory access" : "?"; }

TEST_F(FusedOpsTest, AKernelErrorIsAnExceptionNamingTheOp) {
  internal::FusedKernelTable failing = testing::HostFusedKernels();
  failing.rms_norm_forward = &FailingRmsNormForward;
  failing.status_string = &FailingStatus;
  internal::SetHostKernelsForTesting(&failing);
  try {
    RmsNorm(torch::randn({2, 64}), torch::randn({64}), 1e-6);
    ADD_FAILURE() << "no exception";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused RmsNorm forward kernel: an illegal memory access"),
              std::string::npos)
        << e.what();
  }
  internal::SetHostKernelsForTesting(&testing::HostFusedKernels());
}

// ---- the decoder -----------------------------------------------------------------------------

// Logits and every parameter's gradient of the tiny model on a left-padded batch with an image
// (M-RoPE's three position rows), with the fused ops on and off.
TEST_F(FusedOpsTest, DecoderForwardAndBackwardMatchWithFusedOpsOnAndOff) {
  ModelInputs in = testing::PaddedBatchWithImage();

  torch::manual_seed(3);
  Qwen2VLForConditionalGeneration net(testing::TinyConfig());
  net.train();
  const torch::Tensor weights = torch::randn({1, 1, testing::TinyConfig().vocab_size}) / 100;
  auto run = [&](bool fused) {
    SetFusedKernelsEnabled(fused);
    net.zero_grad();
    const torch::Tensor logits = net.forward(in);
    (logits * weights).sum().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : net.parameters()) grads.push_back(p.grad().clone());
    SetFusedKernelsEnabled(true);
    return std::make_pair(logits.detach(), grads);
  };
  const int norms = HostCalls().rms_norm_backward, rotaries = HostCalls().rotary_backward,
            mlps = HostCalls().swiglu_backward;
  const auto [fused_logits, fused_grads] = run(true);
  const int layers = testing::TinyConfig().num_hidden_layers;
  EXPECT_EQ(HostCalls().rms_norm_backward, norms + 2 * layers + 1);  // two per layer, the final
  EXPECT_EQ(HostCalls().rotary_backward, rotaries + layers);
  EXPECT_EQ(HostCalls().swiglu_backward, mlps + layers);
  const auto [logits, grads] = run(false);
  EXPECT_LT(RelDiff(fused_logits, logits), 1e-5);
  ASSERT_EQ(fused_grads.size(), grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_LT(RelDiff(fused_grads[i], grads[i]), 1e-4) << "parameter " << i;
  }
}

}  // namespace
}  // namespace trainctl::model
