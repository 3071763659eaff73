// Comparisons for the fused ops' tests (tests/model/fused_ops_test.cc on CPU, tests/gpu on CUDA).
#ifndef TRAINCTL_TESTS_MODEL_FUSED_TEST_UTIL_H_
#define TRAINCTL_TESTS_MODEL_FUSED_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/model/model_test_util.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::model::testing {

// Values as ordered integers (float32, bfloat16, float16), so that a difference counts units in
// the last place.
inline torch::Tensor Ordered(const torch::Tensor& t) {
  const bool wide = t.scalar_type() == torch::kFloat32;
  const torch::Tensor bits =
      t.to(torch::kCPU).contiguous().view(wide ? torch::kInt32 : torch::kInt16).to(torch::kInt64);
  const torch::Tensor magnitude = torch::bitwise_and(bits, wide ? 0x7fffffff : 0x7fff);
  return torch::where(bits < 0, -magnitude, magnitude);
}

inline int64_t MaxUlp(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.scalar_type(), b.scalar_type());
  EXPECT_EQ(a.sizes(), b.sizes());
  return (Ordered(a) - Ordered(b)).abs().max().item<int64_t>();
}

// The fraction of elements whose values differ at all.
inline double Mismatch(const torch::Tensor& a, const torch::Tensor& b) {
  return (Ordered(a) != Ordered(b)).to(torch::kFloat64).mean().item<double>();
}

// max |a - b| / max |b|, in float64.
inline double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kCPU, torch::kFloat64),
                      y = b.to(torch::kCPU, torch::kFloat64);
  return (x - y).abs().max().item<double>() / std::max(y.abs().max().item<double>(), 1e-30);
}

// What a gradient may differ by, relative to its largest value: float32 by a few roundings; a
// half type by the rounding of its last operations (2^-7 for bfloat16, 2^-10 for float16).
inline double GradTolerance(torch::ScalarType t) {
  return t == torch::kFloat32 ? 2e-6 : t == torch::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
}

// The name of the node that made `t` (a fused op's Function: "...RmsNormFunction>" and so on).
inline std::string GradFnName(const torch::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : std::string("(no grad_fn)");
}

inline torch::Tensor Leaf(const torch::Tensor& t) {
  return t.detach().clone().requires_grad_(true);
}

// Two rows for the decoder tests: text behind two padding tokens, and an image (a 4 x 6 grid,
// 6 merged tokens) before the same text, so M-RoPE's three position rows differ.
inline ModelInputs PaddedBatchWithImage() {
  const std::vector<int64_t> text = {9707, 11, 1879, 0, 220, 16, 17, 18, 19};
  const std::vector<int64_t> a = Concat({{151643, 151643}, text, {24, 25, 26, 27, 28, 29, 30}});
  const std::vector<int64_t> b = Concat({{40}, ImageTokens(6), text});
  ModelInputs in;
  in.input_ids = Ids({a, b});
  std::vector<int64_t> mask_a(a.size(), 1), mask_b(b.size(), 1);
  mask_a[0] = mask_a[1] = 0;
  in.attention_mask = Ids({mask_a, mask_b});
  in.pixel_values = RandomPixels({{1, 4, 6}});
  in.image_grid_thw = Grid({{1, 4, 6}});
  return in;
}

}  // namespace trainctl::model::testing

#endif  // TRAINCTL_TESTS_MODEL_FUSED_TEST_UTIL_H_
