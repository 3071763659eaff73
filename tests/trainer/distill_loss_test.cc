// Logit distillation's divergences (stages/distill_loss.h) against hand arithmetic and against a
// plain double-precision reference written with loops, not tensor code.
#include "worker/trainer/stages/distill_loss.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace trainctl::trainer {
namespace {

using Rows = std::vector<std::vector<double>>;

torch::Tensor ToTensor(const Rows& rows) {
  std::vector<float> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  return torch::tensor(flat).reshape(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

std::vector<double> Softmax(const std::vector<double>& logits, double temperature) {
  double max = logits[0] / temperature;
  for (double x : logits) max = std::max(max, x / temperature);
  std::vector<double> p;
  double sum = 0;
  for (double x : logits) {
    p.push_back(std::exp(x / temperature - max));
    sum += p.back();
  }
  for (double& x : p) x /= sum;
  return p;
}

double Kl(const std::vector<double>& p, const std::vector<double>& q) {
  double kl = 0;
  for (size_t v = 0; v < p.size(); ++v) kl += p[v] * std::log(p[v] / q[v]);
  return kl;
}

// sum over rows of beta KL(T || M) + (1 - beta) KL(S || M), M = (1 - beta) S + beta T.
double ReferenceJsd(const Rows& student, const Rows& teacher, double beta, double temperature) {
  double total = 0;
  for (size_t n = 0; n < student.size(); ++n) {
    const auto s = Softmax(student[n], temperature), t = Softmax(teacher[n], temperature);
    std::vector<double> m;
    for (size_t v = 0; v < s.size(); ++v) m.push_back((1 - beta) * s[v] + beta * t[v]);
    total += beta * Kl(t, m) + (1 - beta) * Kl(s, m);
  }
  return total;
}

double ReferenceKl(const Rows& student, const Rows& teacher, double temperature, bool forward) {
  double total = 0;
  for (size_t n = 0; n < student.size(); ++n) {
    const auto s = Softmax(student[n], temperature), t = Softmax(teacher[n], temperature);
    total += forward ? Kl(t, s) : Kl(s, t);
  }
  return total;
}

// Rows chosen so that every term matters: N = 3 positions over V = 5.
const Rows kStudent = {{0.5, -1.0, 2.0, 0.0, 0.25}, {1.5, 1.5, -0.5, 0.0, 3.0}, {0, 0, 0, 0, 0}};
const Rows kTeacher = {{2.0, -0.5, 0.0, 1.0, -2.0}, {0.0, 4.0, 0.5, -1.0, 1.0}, {3, 0, 0, 0, -3}};

double Value(const torch::Tensor& t) { return t.item<double>(); }

// One position, V = 2. Student logits [0, 0]: S = [1/2, 1/2]. Teacher logits [ln 3, 0]:
// T = [3/4, 1/4].
//   forward KL(T || S) = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.30409883 - 0.17328680 = 0.13081204
//   reverse KL(S || T) = 1/2 ln(2/3) + 1/2 ln 2    = -0.20273255 + 0.34657359 = 0.14384104
//   JSD, beta 1/2: M = [5/8, 3/8];
//     KL(T || M) = 3/4 ln(6/5) + 1/4 ln(2/3) = 0.13674119 - 0.10136628 = 0.03537492
//     KL(S || M) = 1/2 ln(4/5) + 1/2 ln(4/3) = -0.11157178 + 0.14384104 = 0.03226926
//     JSD = (0.03537492 + 0.03226926) / 2 = 0.03382208
TEST(DistillLossTest, HandComputedTwoTokenExample) {
  const torch::Tensor student = torch::tensor({0.0f, 0.0f}).reshape({1, 2});
  const torch::Tensor teacher =
      torch::tensor({static_cast<float>(std::log(3.0)), 0.0f}).reshape({1, 2});
  EXPECT_NEAR(Value(ForwardKlSum(student, teacher, 1.0)), 0.1308120359, 1e-6);
  EXPECT_NEAR(Value(ReverseKlSum(student, teacher, 1.0)), 0.1438410362, 1e-6);
  EXPECT_NEAR(Value(GeneralizedJsdSum(student, teacher, 0.5, 1.0)), 0.0338220756, 1e-6);
}

TEST(DistillLossTest, ForwardAndReverseKlMatchTheReferenceSummedOverPositions) {
  const torch::Tensor s = ToTensor(kStudent), t = ToTensor(kTeacher);
  for (double temperature : {1.0, 2.0, 0.7}) {
    EXPECT_NEAR(Value(ForwardKlSum(s, t, temperature)),
                ReferenceKl(kStudent, kTeacher, temperature, /*forward=*/true), 1e-6)
        << temperature;
    EXPECT_NEAR(Value(ReverseKlSum(s, t, temperature)),
                ReferenceKl(kStudent, kTeacher, temperature, /*forward=*/false), 1e-6)
        << temperature;
  }
}

TEST(DistillLossTest, GeneralizedJsdMatchesTheReferenceAndBetaWeighsTheTeacherSide) {
  const torch::Tensor s = ToTensor(kStudent), t = ToTensor(kTeacher);
  for (double beta : {0.1, 0.3, 0.5, 0.9}) {
    for (double temperature : {1.0, 2.0}) {
      EXPECT_NEAR(Value(GeneralizedJsdSum(s, t, beta, temperature)),
                  ReferenceJsd(kStudent, kTeacher, beta, temperature), 1e-6)
          << "beta " << beta << " temperature " << temperature;
    }
  }
  // Asymmetric in beta: swapping the models is the same as beta -> 1 - beta.
  EXPECT_NEAR(Value(GeneralizedJsdSum(s, t, 0.3, 1.0)), Value(GeneralizedJsdSum(t, s, 0.7, 1.0)),
              1e-6);
  EXPECT_GT(
      std::abs(Value(GeneralizedJsdSum(s, t, 0.3, 1.0)) - Value(GeneralizedJsdSum(s, t, 0.7, 1.0))),
      1e-3);
}

// TRL takes beta 0 and 1 as the two KLs (the mixture formula itself vanishes there).
TEST(DistillLossTest, BetaZeroIsForwardKlAndBetaOneIsReverseKl) {
  const torch::Tensor s = ToTensor(kStudent), t = ToTensor(kTeacher);
  EXPECT_NEAR(Value(GeneralizedJsdSum(s, t, 0.0, 1.5)),
              ReferenceKl(kStudent, kTeacher, 1.5, /*forward=*/true), 1e-6);
  EXPECT_NEAR(Value(GeneralizedJsdSum(s, t, 1.0, 1.5)),
              ReferenceKl(kStudent, kTeacher, 1.5, /*forward=*/false), 1e-6);
  // Near the ends the mixture tends to 0: beta KL(T || M) with M -> S, and so on.
  EXPECT_LT(Value(GeneralizedJsdSum(s, t, 1e-4, 1.0)), 1e-3);
}

TEST(DistillLossTest, DispatchTemperatureAndGradients) {
  const torch::Tensor s = ToTensor(kStudent).requires_grad_(true), t = ToTensor(kTeacher);
  DistillLossOptions options;
  options.type = DistillLossType::kForwardKl;
  options.temperature = 2.0;
  // Temperature divides both logits: the same as halving them at temperature 1.
  EXPECT_NEAR(Value(DistillLossSum(s, t, options)), Value(ForwardKlSum(s / 2, t / 2, 1.0)), 1e-6);
  options.type = DistillLossType::kJsd;
  options.beta = 0.25;
  torch::Tensor loss = DistillLossSum(s, t, options);
  EXPECT_NEAR(Value(loss), ReferenceJsd(kStudent, kTeacher, 0.25, 2.0), 1e-6);
  loss.backward();
  ASSERT_TRUE(s.grad().defined());
  EXPECT_TRUE(torch::isfinite(s.grad()).all().item<bool>());
  EXPECT_GT(s.grad().abs().sum().item<double>(), 0);
  // Equal distributions: every divergence is 0.
  for (DistillLossType type :
       {DistillLossType::kForwardKl, DistillLossType::kReverseKl, DistillLossType::kJsd}) {
    options.type = type;
    EXPECT_NEAR(Value(DistillLossSum(t, t, options)), 0.0, 1e-6);
  }
  EXPECT_EQ(ParseDistillLossType("kl").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseDistillLossType("reverse_kl"), DistillLossType::kReverseKl);
}

}  // namespace
}  // namespace trainctl::trainer
