// The head fused with cross-entropy (internal/linear_cross_entropy.h, HeadCrossEntropy) against
// the unfused cross_entropy(linear(x, w).float(), labels, sum): value and gradients, chunked or
// not, with ignored rows, and on the tiny model with its tied head.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/model/model_test_util.h"
#include "worker/trainer/model/internal/linear_cross_entropy.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::model {
namespace {

using testing::Ids;
using testing::TinyConfig;

torch::Tensor Unfused(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      torch::linear(x, w).to(torch::kFloat32), labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(-100));
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6))
      << what << ": max diff " << (a - b).abs().max().item<double>();
}

TEST(LinearCrossEntropyTest, EqualsTheUnfusedLossAndGradientsInAnyChunking) {
  torch::manual_seed(4);
  const int64_t n = 11, h = 16, v = 37;
  const torch::Tensor x0 = torch::randn({n, h}), w0 = torch::randn({v, h}) * 0.3;
  torch::Tensor labels = torch::randint(0, v, {n}, torch::kInt64);
  labels[2] = -100;  // ignored rows add nothing and get no gradient
  labels[7] = -100;
  torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const torch::Tensor expected = Unfused(x, w, labels);
  const auto expected_grads = torch::autograd::grad({expected * 0.7}, {x, w});
  for (int64_t chunk : {1, 3, 4, 11, 0}) {
    SCOPED_TRACE(chunk);
    torch::Tensor xf = x0.clone().requires_grad_(), wf = w0.clone().requires_grad_();
    const torch::Tensor loss = internal::LinearCrossEntropySum(xf, wf, labels, -100, chunk);
    ExpectClose(loss, expected, "loss");
    const auto grads = torch::autograd::grad({loss * 0.7}, {xf, wf});
    ExpectClose(grads[0], expected_grads[0], "d/dx");
    ExpectClose(grads[1], expected_grads[1], "d/dw");
    EXPECT_EQ(grads[0][2].abs().sum().item<double>(), 0);
  }
  // Without gradients wanted: the loss alone.
  torch::NoGradGuard no_grad;
  ExpectClose(internal::LinearCrossEntropySum(x0, w0, labels, -100, 5), expected, "no grad");
}

TEST(LinearCrossEntropyTest, RefusesMismatchedShapes) {
  EXPECT_THROW(internal::LinearCrossEntropySum(torch::randn({4, 8}), torch::randn({5, 7}),
                                               torch::zeros({4}, torch::kInt64)),
               c10::Error);
  EXPECT_THROW(internal::LinearCrossEntropySum(torch::randn({4, 8}), torch::randn({5, 8}),
                                               torch::zeros({3}, torch::kInt64)),
               c10::Error);
}

// The tiny model (tied head): HeadCrossEntropy gives the unfused loss and every parameter's
// gradient, in chunks of 5 rows.
TEST(LinearCrossEntropyTest, HeadCrossEntropyMatchesTheModelsHead) {
  torch::manual_seed(2);
  Qwen2VLForConditionalGeneration model(TinyConfig());
  model.train();
  ModelInputs in;
  in.input_ids = Ids({{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}});
  const torch::Tensor labels = in.input_ids.slice(1, 1).reshape({-1});
  auto run = [&](bool fused) {
    model.zero_grad();
    const torch::Tensor hidden = model.ForwardHidden(in);
    const torch::Tensor rows = hidden.slice(1, 0, 7).reshape({-1, hidden.size(-1)});
    torch::Tensor loss =
        fused ? model.HeadCrossEntropy(rows, labels, /*chunk_rows=*/5)
              : torch::nn::functional::cross_entropy(
                    model.Head(rows).to(torch::kFloat32), labels,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : model.named_parameters()) {
      if (p.value().grad().defined()) grads[p.key()] = p.value().grad().clone();
    }
    return std::make_pair(loss.detach(), grads);
  };
  const auto [expected, expected_grads] = run(false);
  const auto [loss, grads] = run(true);
  ExpectClose(loss, expected, "loss");
  ASSERT_EQ(grads.size(), expected_grads.size());
  for (const auto& [name, g] : expected_grads) ExpectClose(grads.at(name), g, name);
}

}  // namespace
}  // namespace trainctl::model
