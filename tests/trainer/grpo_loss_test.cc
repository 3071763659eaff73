// GRPO advantages and loss against numbers computed by hand and by plain double loops (never by
// the tensor code under test), the gradient against a hand formula and finite differences, and the
// distributed-scaling invariant: summed contributions of 2 ranks x 1 micro-batch == 1 rank x 2
// micro-batches == TRL's single-batch loss where TRL's semantics say so.
#include "worker/trainer/stages/grpo_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace trainctl::trainer {
namespace {

using Matrix = std::vector<std::vector<double>>;

constexpr double kTol = 1e-6;

// The shared example, B = 4 rows, C = 4 tokens, eps_low 0.2, eps_high 0.28:
//   log_ratio = logps - old          coef_1 = exp(log_ratio)           mask   A
//   row 0: [ 0.5,  0,   -0.3,  0 ]  [1.648721, 1, 0.740818, 1]       1110   1.5
//   row 1: [-0.1, -0.5,  0,    1 ]  [0.904837, 0.606531, 1, 2.718282] 1111  -0.8
//   row 2: [ 0,    0.2, -0.2,  0 ]  [1, 1.221403, 0.818731, 1]       1100   0.4
//   row 3: [-0.2, -0.2,  0.3,  0 ]  [0.818731, 0.818731, 1.349859, 1] 1101  -1.2
// Clipping (token level): row 0 token 0 has coef 1.6487 > 1.28 with A > 0: high-clipped, its loss
// is -1.28 * 1.5 = -1.92 and carries no gradient. Row 1 token 1 has coef 0.6065 < 0.8 with A < 0:
// low-clipped, loss -(0.8 * -0.8) = 0.64, no gradient. Row 0 token 2 (coef 0.7408 < 0.8, A > 0)
// and row 1 token 3 (coef 2.718 > 1.28, A < 0) are NOT clipped: min() keeps coef_1 * A there.
// Sequence level (masked mean of log_ratio per row): row 0: 0.2/3 -> coef 1.068939; row 1: 0.4/4
// -> 1.105171; row 2: 0.2/2 -> 1.105171; row 3: -0.4/3 -> 0.875173. With eps 0.05 rows 0 and 2
// are high-clipped (A > 0) and row 3 low-clipped (A < 0); row 1 (A < 0, coef > 1.05) is not.
struct Example {
  Matrix logps = {{-1.0, -0.5, -2.0, -0.3},
                  {-0.2, -1.5, -0.7, -1.0},
                  {-0.9, -0.4, -1.2, -0.6},
                  {-0.5, -0.8, -1.0, -0.4}};
  Matrix old = {{-1.5, -0.5, -1.7, -0.3},
                {-0.1, -1.0, -0.7, -2.0},
                {-0.9, -0.6, -1.0, -0.6},
                {-0.3, -0.6, -1.3, -0.4}};
  Matrix ref = {{-1.2, -0.4, -2.1, -0.5},
                {-0.3, -1.4, -0.9, -1.0},
                {-1.0, -0.5, -1.1, -0.2},
                {-0.6, -0.7, -1.0, -0.5}};
  Matrix mask = {{1, 1, 1, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}, {1, 1, 0, 1}};
  std::vector<double> adv = {1.5, -0.8, 0.4, -1.2};

  Example Rows(int64_t begin, int64_t end) const {
    Example e;
    auto cut = [&](const auto& v) {
      return std::decay_t<decltype(v)>(v.begin() + begin, v.begin() + end);
    };
    e.logps = cut(logps), e.old = cut(old), e.ref = cut(ref), e.mask = cut(mask), e.adv = cut(adv);
    return e;
  }
};

torch::Tensor T(const Matrix& m) {
  std::vector<double> flat;
  for (const auto& row : m) flat.insert(flat.end(), row.begin(), row.end());
  return torch::tensor(flat, torch::kDouble)
      .reshape({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())});
}

struct Tensors {
  torch::Tensor logps;
  GrpoLossInputs in;
};

Tensors Make(const Example& e, bool with_old = true) {
  Tensors t;
  t.logps = T(e.logps).requires_grad_(true);
  t.in.per_token_logps = t.logps;
  if (with_old) t.in.old_per_token_logps = T(e.old);
  t.in.ref_per_token_logps = T(e.ref);
  t.in.advantages = torch::tensor(e.adv, torch::kDouble);
  t.in.completion_mask = T(e.mask).to(torch::kBool);
  return t;
}

// TRL's _compute_loss written as plain loops over doubles: the micro-batch loss before any
// accumulation division (TRL's policy_loss), and the logged statistics.
struct Reference {
  double loss = 0;
  GrpoLossStats stats;
};

Reference RefLoss(const Example& e, const GrpoLossOptions& o, double dapo_normalizer) {
  const size_t rows = e.logps.size(), cols = e.logps[0].size();
  const bool seq = o.importance_sampling_level == ImportanceSamplingLevel::kSequence;
  Reference r;
  double total = 0, tokens = 0, grpo_sum = 0;
  for (size_t i = 0; i < rows; ++i) {
    double n = 0, seq_log_w = 0;
    for (size_t j = 0; j < cols; ++j) {
      n += e.mask[i][j];
      seq_log_w += e.mask[i][j] * (e.logps[i][j] - e.old[i][j]);
    }
    seq_log_w /= std::max(n, 1.0);
    double row_sum = 0;
    for (size_t j = 0; j < cols; ++j) {
      const double c1 = std::exp(seq ? seq_log_w : e.logps[i][j] - e.old[i][j]);
      const double c2 = std::clamp(c1, 1 - o.epsilon_low, 1 + o.epsilon_high);
      double l = -std::min(c1 * e.adv[i], c2 * e.adv[i]);
      const double d = e.ref[i][j] - e.logps[i][j];
      const double kl = std::exp(d) - d - 1;
      if (o.beta != 0) {
        l += o.beta * kl;
        r.stats.kl_sum += e.mask[i][j] * kl;
        r.stats.kl_count += e.mask[i][j];
      }
      row_sum += e.mask[i][j] * l;
      const double low = (c1 < 1 - o.epsilon_low && e.adv[i] < 0) ? 1 : 0;
      const double high = (c1 > 1 + o.epsilon_high && e.adv[i] > 0) ? 1 : 0;
      const double weight = seq ? (j == 0 ? 1.0 : 0.0) : e.mask[i][j];  // seq: once per row
      r.stats.clip_low_sum += weight * low;
      r.stats.clip_high_sum += weight * high;
      r.stats.clip_region_sum += weight * std::max(low, high);
      r.stats.clip_count += weight;
    }
    total += row_sum;
    tokens += n;
    grpo_sum += row_sum / std::max(n, 1.0);
  }
  switch (o.loss_type) {
    case GrpoLossType::kGrpo:
      r.loss = grpo_sum / static_cast<double>(rows);
      break;
    case GrpoLossType::kBnpo:
      r.loss = total / std::max(tokens, 1.0);
      break;
    case GrpoLossType::kDrGrpo:
      r.loss = total / static_cast<double>(rows * o.max_completion_length);
      break;
    case GrpoLossType::kDapo:
      r.loss = total / dapo_normalizer;
      break;
  }
  return r;
}

GrpoLossOutput LossOf(const GrpoLossInputs& in, const GrpoLossOptions& o, const GrpoStepShape& s) {
  auto out = GrpoLoss(in, o, s);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move(*out) : GrpoLossOutput{};
}

void ExpectStatsNear(const GrpoLossStats& a, const GrpoLossStats& b) {
  EXPECT_NEAR(a.kl_sum, b.kl_sum, kTol);
  EXPECT_NEAR(a.kl_count, b.kl_count, kTol);
  EXPECT_NEAR(a.clip_low_sum, b.clip_low_sum, kTol);
  EXPECT_NEAR(a.clip_high_sum, b.clip_high_sum, kTol);
  EXPECT_NEAR(a.clip_region_sum, b.clip_region_sum, kTol);
  EXPECT_NEAR(a.clip_count, b.clip_count, kTol);
}

TEST(GrpoLossTest, HandComputedGrpoTokenLevel) {
  // Per-token loss l = -min(coef_1 A, coef_2 A), masked, beta = 0:
  //   row 0 (A 1.5): -1.92 (clipped) - 1.5 - 0.740818 * 1.5 = -4.531227, 3 tokens -> -1.510409
  //   row 1 (A -0.8): 0.904837 * 0.8 + 0.64 (clipped) + 0.8 + 2.718282 * 0.8 = 4.338495, / 4
  //     -> 1.084624
  //   row 2 (A 0.4): -0.4 - 1.221403 * 0.4 = -0.888561, / 2 -> -0.444281
  //   row 3 (A -1.2): 2 * 0.818731 * 1.2 + 1.2 = 3.164954, / 3 -> 1.054985
  // grpo = mean of the row means = 0.184919 / 4 = 0.046230; sum = 2.084061 over 12 tokens:
  // bnpo = dapo (N = 12, one rank) = 0.173638; dr_grpo (L = 5) = 2.084061 / 20 = 0.104183.
  // Clip stats over the 12 active tokens: one low (row 1 token 1), one high (row 0 token 0).
  const Example e;
  GrpoLossOptions o;
  o.epsilon_high = 0.28;
  o.max_completion_length = 5;
  const GrpoStepShape shape{1, 1, 12};
  const double expected[] = {0.0462296974, 0.1736383975, 0.1041830385, 0.1736383975};
  const GrpoLossType types[] = {GrpoLossType::kGrpo, GrpoLossType::kBnpo, GrpoLossType::kDrGrpo,
                                GrpoLossType::kDapo};
  for (int k = 0; k < 4; ++k) {
    o.loss_type = types[k];
    const GrpoLossOutput out = LossOf(Make(e).in, o, shape);
    EXPECT_NEAR(out.policy_loss, expected[k], kTol) << k;
    EXPECT_NEAR(out.contribution.item<double>(), expected[k], kTol) << k;
    EXPECT_NEAR(out.stats.ClipLowMean(), 1.0 / 12, kTol);
    EXPECT_NEAR(out.stats.ClipHighMean(), 1.0 / 12, kTol);
    EXPECT_NEAR(out.stats.ClipRegionMean(), 2.0 / 12, kTol);
    EXPECT_EQ(out.stats.kl_count, 0);  // beta == 0: no KL
  }
}

// Every loss type x importance level x beta x clip range against the double-loop reference.
TEST(GrpoLossTest, AllVariantsMatchReference) {
  const Example e;
  const GrpoLossType types[] = {GrpoLossType::kGrpo, GrpoLossType::kBnpo, GrpoLossType::kDrGrpo,
                                GrpoLossType::kDapo};
  for (GrpoLossType type : types) {
    for (auto level : {ImportanceSamplingLevel::kToken, ImportanceSamplingLevel::kSequence}) {
      for (double beta : {0.0, 0.04}) {
        for (double eps : {0.2, 0.05}) {
          GrpoLossOptions o{type, eps, eps == 0.2 ? 0.28 : eps, beta, level, 6};
          // Two ranks, two micro-batches each; this micro-batch's global-token share is 12 of 40.
          const GrpoStepShape shape{2, 2, 40};
          const Reference ref = RefLoss(e, o, 40.0 / 2);
          const GrpoLossOutput out = LossOf(Make(e).in, o, shape);
          const std::string what = "type " + std::to_string(static_cast<int>(type)) + " level " +
                                   std::to_string(static_cast<int>(level)) + " beta " +
                                   std::to_string(beta) + " eps " + std::to_string(eps);
          EXPECT_NEAR(out.policy_loss, ref.loss, kTol) << what;
          const double share = type == GrpoLossType::kDapo ? ref.loss / 2 : ref.loss / 4;
          EXPECT_NEAR(out.contribution.item<double>(), share, kTol) << what;
          ExpectStatsNear(out.stats, ref.stats);
        }
      }
    }
  }
}

TEST(GrpoLossTest, SequenceLevelClipStatsCountRows) {
  // eps 0.05 at sequence level: rows 0 and 2 high-clipped, row 3 low-clipped, out of 4 rows.
  GrpoLossOptions o;
  o.epsilon_low = o.epsilon_high = 0.05;
  o.importance_sampling_level = ImportanceSamplingLevel::kSequence;
  const GrpoLossOutput out = LossOf(Make(Example()).in, o, GrpoStepShape{1, 1, 12});
  EXPECT_NEAR(out.stats.ClipHighMean(), 2.0 / 4, kTol);
  EXPECT_NEAR(out.stats.ClipLowMean(), 1.0 / 4, kTol);
  EXPECT_NEAR(out.stats.ClipRegionMean(), 3.0 / 4, kTol);
}

TEST(GrpoLossTest, KlStatisticIsMaskedMeanOfK3) {
  // k3 = exp(ref - logp) - (ref - logp) - 1, e.g. row 0 token 0: d = -0.2 -> e^-0.2 + 0.2 - 1
  // = 0.018731; row 1 token 3: d = 0 -> 0. The masked mean over 12 tokens, from the loops.
  GrpoLossOptions o;
  o.beta = 0.1;
  const GrpoLossOutput out = LossOf(Make(Example()).in, o, GrpoStepShape{1, 1, 12});
  const Reference ref = RefLoss(Example(), o, 12);
  EXPECT_NEAR(out.stats.KlMean(), ref.stats.kl_sum / 12, kTol);
  EXPECT_NEAR(out.stats.kl_count, 12, kTol);
  EXPECT_GT(out.stats.KlMean(), 0.0);
}

TEST(GrpoLossTest, MissingOldLogpsMeansRatioOne) {
  // old = logps.detach(): coef_1 = 1 everywhere, nothing clipped, l = -A per token. dapo over 12
  // tokens: -(1.5*3 - 0.8*4 + 0.4*2 - 1.2*3) / 12 = -(4.5 - 3.2 + 0.8 - 3.6) / 12 = 0.125.
  // Gradient: d l / d logp = -A exp(0) = -A per active token, / 12.
  GrpoLossOptions o;
  Tensors t = Make(Example(), /*with_old=*/false);
  const GrpoLossOutput out = LossOf(t.in, o, GrpoStepShape{1, 1, 12});
  EXPECT_NEAR(out.contribution.item<double>(), 0.125, kTol);
  EXPECT_EQ(out.stats.clip_region_sum, 0);
  out.contribution.backward();
  const auto g = t.logps.grad();
  EXPECT_NEAR(g[0][0].item<double>(), -1.5 / 12, kTol);
  EXPECT_NEAR(g[1][3].item<double>(), 0.8 / 12, kTol);
  EXPECT_NEAR(g[2][3].item<double>(), 0.0, kTol);  // masked
}

TEST(GrpoLossTest, TokenGradientMatchesHandFormula) {
  // dapo, token level, beta 0.04, N = 12. For an active token:
  //   d/d logp = (1/N) [ -A coef_1 * (not clipped) + beta (1 - exp(ref - logp)) ]
  // where "clipped" is exactly TRL's is_low_clipped | is_high_clipped (min() picks the constant
  // coef_2 * A there); masked tokens get 0.
  const Example e;
  GrpoLossOptions o;
  o.epsilon_high = 0.28;
  o.beta = 0.04;
  Tensors t = Make(e);
  LossOf(t.in, o, GrpoStepShape{1, 1, 12}).contribution.backward();
  const auto g = t.logps.grad();
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) {
      const double c1 = std::exp(e.logps[i][j] - e.old[i][j]);
      const bool clipped = (c1 < 0.8 && e.adv[i] < 0) || (c1 > 1.28 && e.adv[i] > 0);
      const double policy = clipped ? 0.0 : -e.adv[i] * c1;
      const double kl = o.beta * (1 - std::exp(e.ref[i][j] - e.logps[i][j]));
      const double expected = e.mask[i][j] * (policy + kl) / 12;
      EXPECT_NEAR(g[i][j].item<double>(), expected, 1e-9) << i << "," << j;
    }
  }
  EXPECT_NEAR(g[0][0].item<double>(), 0.04 * (1 - std::exp(-0.2)) / 12, 1e-12);  // clipped: KL only
}

TEST(GrpoLossTest, SequenceGradientMatchesFiniteDifferences) {
  const Example e;
  GrpoLossOptions o{GrpoLossType::kGrpo, 0.2, 0.28, 0.04, ImportanceSamplingLevel::kSequence, 4};
  Tensors t = Make(e);
  LossOf(t.in, o, GrpoStepShape{1, 1, 0}).contribution.backward();
  const auto g = t.logps.grad();
  const double h = 1e-6;
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) {
      Example plus = e, minus = e;
      plus.logps[i][j] += h;
      minus.logps[i][j] -= h;
      const double fd = (RefLoss(plus, o, 1).loss - RefLoss(minus, o, 1).loss) / (2 * h);
      EXPECT_NEAR(g[i][j].item<double>(), fd, 1e-7) << i << "," << j;
    }
  }
}

// The invariant: the summed contributions of a step equal TRL's objective whatever the split.
// The global batch is the 4 example rows; rank/micro-batch pieces are rows [0, 2) and [2, 4).
TEST(GrpoLossTest, TwoRanksEqualTwoMicroBatchesEqualTrl) {
  const Example e;
  const double global_tokens = 12;  // 3 + 4 + 2 + 3, as the caller's all-reduce would give
  const GrpoLossType types[] = {GrpoLossType::kGrpo, GrpoLossType::kBnpo, GrpoLossType::kDrGrpo,
                                GrpoLossType::kDapo};
  for (GrpoLossType type : types) {
    for (auto level : {ImportanceSamplingLevel::kToken, ImportanceSamplingLevel::kSequence}) {
      GrpoLossOptions o{type, 0.2, 0.28, 0.04, level, 5};
      auto sum = [&](const GrpoStepShape& shape) {
        double total = 0;
        for (int64_t begin : {0, 2}) {
          total += LossOf(Make(e.Rows(begin, begin + 2)).in, o, shape).contribution.item<double>();
        }
        return total;
      };
      const double two_ranks = sum(GrpoStepShape{2, 1, global_tokens});
      const double two_micro = sum(GrpoStepShape{1, 2, global_tokens});
      EXPECT_NEAR(two_ranks, two_micro, 1e-12);
      // TRL by hand: DDP averages the two ranks' losses (each / G = 1); or one rank accumulates two
      // micro-batch losses / G = 2. Either way the mean of the two pieces' TRL losses, except dapo
      // whose pieces are sum / (N / P): P = 2 -> (s0 + s1) / 12; P = 1 -> also (s0 + s1) / 12.
      const Reference a = RefLoss(e.Rows(0, 2), o, global_tokens);
      const Reference b = RefLoss(e.Rows(2, 4), o, global_tokens);
      const double trl = type == GrpoLossType::kDapo ? a.loss + b.loss : (a.loss + b.loss) / 2;
      EXPECT_NEAR(two_ranks, trl, kTol);
      // Single batch of all 4 rows: equal for grpo and dr_grpo (equal piece sizes) and dapo; bnpo
      // is per micro-batch in TRL (5 vs 7 tokens here), so it differs.
      const double whole = LossOf(Make(e).in, o, GrpoStepShape{1, 1, global_tokens}).policy_loss;
      if (type == GrpoLossType::kBnpo) {
        EXPECT_GT(std::abs(two_ranks - whole), 1e-3);
      } else {
        EXPECT_NEAR(two_ranks, whole, kTol) << static_cast<int>(type);
      }
    }
  }
}

TEST(GrpoLossTest, FullyMaskedRowAndErrors) {
  Example e = Example().Rows(0, 2);
  e.mask[1] = {0, 0, 0, 0};  // a truncated completion zeroed by mask_truncated_completions
  GrpoLossOptions o;
  o.loss_type = GrpoLossType::kGrpo;
  o.epsilon_high = 0.28;
  // Row 1 contributes 0 / max(0, 1) = 0: grpo = (-1.510409 + 0) / 2.
  EXPECT_NEAR(LossOf(Make(e).in, o, GrpoStepShape{}).policy_loss, -1.510409110 / 2, kTol);
  EXPECT_NEAR(ActiveTokens(T(e.mask)), 3, 0);

  o.beta = 0.1;
  Tensors t = Make(e);
  t.in.ref_per_token_logps = torch::Tensor();
  EXPECT_EQ(GrpoLoss(t.in, o, GrpoStepShape{}).status().code(), absl::StatusCode::kInvalidArgument);
  t = Make(e);
  t.in.advantages = torch::zeros({3}, torch::kDouble);
  EXPECT_FALSE(GrpoLoss(t.in, o, GrpoStepShape{}).ok());
  EXPECT_FALSE(ParseGrpoLossType("ppo").ok());
  EXPECT_EQ(*ParseGrpoLossType("dr_grpo"), GrpoLossType::kDrGrpo);
  EXPECT_EQ(*ParseScaleRewards("batch"), ScaleRewards::kBatch);
  EXPECT_EQ(*ParseImportanceSamplingLevel("sequence"), ImportanceSamplingLevel::kSequence);
}

std::vector<double> ToVector(const torch::Tensor& t) {
  const torch::Tensor d = t.to(torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void ExpectVectorNear(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], kTol) << i;
}

// Two prompts x 3 generations: group 0 = {1, 0, 2} (mean 1, unbiased std sqrt((0+1+1)/2) = 1),
// group 1 = {0.5, 0.5, 0.5} (mean 0.5, std 0). All six: mean 4.5 / 6 = 0.75; squared deviations
// 0.0625 + 0.5625 + 1.5625 + 3 * 0.0625 = 2.375, unbiased std sqrt(2.375 / 5) = 0.689202.
TEST(AdvantagesTest, GroupBatchNone) {
  const torch::Tensor r = torch::tensor({1.0, 0.0, 2.0, 0.5, 0.5, 0.5});
  const double batch_std = std::sqrt(2.375 / 5);

  auto group = ComputeAdvantages(r, 3, ScaleRewards::kGroup);
  ASSERT_TRUE(group.ok()) << group.status();
  // (r - 1) / (1 + 1e-4) in group 0; 0 / (0 + 1e-4) = 0 in group 1.
  ExpectVectorNear(ToVector(group->advantages), {0, -1 / 1.0001, 1 / 1.0001, 0, 0, 0});
  EXPECT_NEAR(group->reward_mean, 0.75, kTol);
  EXPECT_NEAR(group->reward_std, batch_std, kTol);      // TRL logs the std of all rewards
  EXPECT_NEAR(group->frac_reward_zero_std, 0.5, kTol);  // group 1's three of six
  EXPECT_EQ(group->advantages.scalar_type(), torch::kFloat32);

  auto batch = ComputeAdvantages(r, 3, ScaleRewards::kBatch);
  ASSERT_TRUE(batch.ok());
  // Still the group mean as baseline; divided by the batch std + 1e-4 = 0.689302.
  const double d = batch_std + 1e-4;
  ExpectVectorNear(ToVector(batch->advantages), {0, -1 / d, 1 / d, 0, 0, 0});
  EXPECT_NEAR(batch->frac_reward_zero_std, 0.0, kTol);  // the batch std is not zero

  auto none = ComputeAdvantages(r, 3, ScaleRewards::kNone);
  ASSERT_TRUE(none.ok());
  ExpectVectorNear(ToVector(none->advantages), {0, -1, 1, 0, 0, 0});
  EXPECT_NEAR(none->frac_reward_zero_std, 0.5, kTol);  // none still reports the group stds
}

TEST(AdvantagesTest, UnscorableAndErrors) {
  // Group 0 = {1, NaN, 3}: mean 2, std sqrt((1 + 1) / 1) = 1.414214; the NaN gets advantage 0.
  // Group 1 = {NaN, 5, NaN}: one value, std NaN -> every advantage 0 (TRL's nan_to_num).
  const double nan = std::nan("");
  const torch::Tensor r = torch::tensor({1.0, nan, 3.0, nan, 5.0, nan});
  auto a = ComputeAdvantages(r, 3, ScaleRewards::kGroup);
  ASSERT_TRUE(a.ok());
  const double d = std::sqrt(2.0) + 1e-4;
  ExpectVectorNear(ToVector(a->advantages), {-1 / d, 0, 1 / d, 0, 0, 0});
  EXPECT_NEAR(a->reward_mean, 3.0, kTol);  // (1 + 3 + 5) / 3
  EXPECT_NEAR(a->reward_std, 2.0, kTol);   // sqrt((4 + 0 + 4) / 2)
  EXPECT_NEAR(a->frac_reward_zero_std, 0.0, kTol);

  EXPECT_FALSE(ComputeAdvantages(torch::ones({5}), 3, ScaleRewards::kGroup).ok());
  EXPECT_FALSE(ComputeAdvantages(torch::ones({2, 3}), 3, ScaleRewards::kGroup).ok());
}

}  // namespace
}  // namespace trainctl::trainer
