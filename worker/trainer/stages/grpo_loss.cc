#include "worker/trainer/stages/grpo_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainctl::trainer {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// TRL's nanmean / nanstd (Bessel-corrected; NaN with fewer than two values) over v[begin, end).
double NanMean(const std::vector<double>& v, size_t begin, size_t end) {
  double sum = 0;
  int64_t n = 0;
  for (size_t i = begin; i < end; ++i) {
    if (!std::isnan(v[i])) {
      sum += v[i];
      ++n;
    }
  }
  return n == 0 ? kNaN : sum / static_cast<double>(n);
}

double NanStd(const std::vector<double>& v, size_t begin, size_t end) {
  const double mean = NanMean(v, begin, end);
  double sq = 0;
  int64_t n = 0;
  for (size_t i = begin; i < end; ++i) {
    if (!std::isnan(v[i])) {
      sq += (v[i] - mean) * (v[i] - mean);
      ++n;
    }
  }
  return n < 2 ? kNaN : std::sqrt(sq / static_cast<double>(n - 1));
}

// torch.isclose(std, 0) with its default atol 1e-8; NaN is not close.
bool IsZeroStd(double std) { return std::abs(std) <= 1e-8; }

double MeanOver(double sum, double count) { return sum / std::max(count, 1.0); }

double ToDouble(const torch::Tensor& t) { return t.detach().to(torch::kDouble).item<double>(); }

absl::Status CheckSameShape(const torch::Tensor& t, const torch::Tensor& like, const char* name) {
  if (!t.defined() || t.sizes() != like.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GrpoLoss: ", name, " must be defined with per_token_logps' shape [B, C]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScaleRewards> ParseScaleRewards(absl::string_view name) {
  if (name == "group") return ScaleRewards::kGroup;
  if (name == "batch") return ScaleRewards::kBatch;
  if (name == "none") return ScaleRewards::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("scale_rewards must be group, batch or none, not '", name, "'"));
}

absl::StatusOr<GrpoLossType> ParseGrpoLossType(absl::string_view name) {
  if (name == "grpo") return GrpoLossType::kGrpo;
  if (name == "bnpo") return GrpoLossType::kBnpo;
  if (name == "dr_grpo") return GrpoLossType::kDrGrpo;
  if (name == "dapo") return GrpoLossType::kDapo;
  return absl::InvalidArgumentError(
      absl::StrCat("loss_type must be grpo, bnpo, dr_grpo or dapo, not '", name, "'"));
}

absl::StatusOr<ImportanceSamplingLevel> ParseImportanceSamplingLevel(absl::string_view name) {
  if (name == "token") return ImportanceSamplingLevel::kToken;
  if (name == "sequence") return ImportanceSamplingLevel::kSequence;
  return absl::InvalidArgumentError(
      absl::StrCat("importance_sampling_level must be token or sequence, not '", name, "'"));
}

absl::StatusOr<Advantages> ComputeAdvantages(const torch::Tensor& rewards, int64_t num_generations,
                                             ScaleRewards scale) {
  if (!rewards.defined() || rewards.dim() != 1 || num_generations < 1 || rewards.size(0) == 0 ||
      rewards.size(0) % num_generations != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ComputeAdvantages: rewards must be 1-D with a positive multiple of num_generations (",
        num_generations, ") elements"));
  }
  const torch::Tensor cpu = rewards.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const std::vector<double> r(cpu.data_ptr<double>(), cpu.data_ptr<double>() + cpu.numel());
  const size_t n = r.size();
  const size_t g = static_cast<size_t>(num_generations);

  const double batch_std = n > 1 ? NanStd(r, 0, n) : 0.0;
  std::vector<double> adv(n);
  int64_t zero_std = 0;
  for (size_t begin = 0; begin < n; begin += g) {
    const double mean = NanMean(r, begin, begin + g);
    // As TRL: one generation (eval) has std 0 rather than NaN.
    const double group_std = g > 1 ? NanStd(r, begin, begin + g) : 0.0;
    const double std = scale == ScaleRewards::kBatch ? batch_std : group_std;
    for (size_t i = begin; i < begin + g; ++i) {
      double a = r[i] - mean;
      if (scale != ScaleRewards::kNone) a /= std + 1e-4;
      adv[i] = std::isnan(a) ? 0.0 : a;
      if (IsZeroStd(std)) ++zero_std;
    }
  }
  Advantages out;
  out.advantages = torch::tensor(adv, torch::kDouble).to(torch::kFloat32);
  out.reward_mean = NanMean(r, 0, n);
  out.reward_std = NanStd(r, 0, n);
  out.frac_reward_zero_std = static_cast<double>(zero_std) / static_cast<double>(n);
  return out;
}

void GrpoLossStats::Add(const GrpoLossStats& o) {
  kl_sum += o.kl_sum;
  kl_count += o.kl_count;
  clip_low_sum += o.clip_low_sum;
  clip_high_sum += o.clip_high_sum;
  clip_region_sum += o.clip_region_sum;
  clip_count += o.clip_count;
}

double GrpoLossStats::KlMean() const { return MeanOver(kl_sum, kl_count); }
double GrpoLossStats::ClipLowMean() const { return MeanOver(clip_low_sum, clip_count); }
double GrpoLossStats::ClipHighMean() const { return MeanOver(clip_high_sum, clip_count); }
double GrpoLossStats::ClipRegionMean() const { return MeanOver(clip_region_sum, clip_count); }

double ActiveTokens(const torch::Tensor& completion_mask) {
  return ToDouble(completion_mask.to(torch::kDouble).sum());
}

absl::StatusOr<GrpoLossOutput> GrpoLoss(const GrpoLossInputs& in, const GrpoLossOptions& opt,
                                        const GrpoStepShape& shape) {
  const torch::Tensor& logps = in.per_token_logps;
  if (!logps.defined() || logps.dim() != 2 || !logps.is_floating_point()) {
    return absl::InvalidArgumentError("GrpoLoss: per_token_logps must be a float [B, C] tensor");
  }
  if (auto s = CheckSameShape(in.completion_mask, logps, "completion_mask"); !s.ok()) return s;
  if (in.old_per_token_logps.defined()) {
    if (auto s = CheckSameShape(in.old_per_token_logps, logps, "old_per_token_logps"); !s.ok()) {
      return s;
    }
  }
  if (opt.beta != 0.0) {
    if (auto s = CheckSameShape(in.ref_per_token_logps, logps, "ref_per_token_logps (beta != 0)");
        !s.ok()) {
      return s;
    }
  }
  const int64_t rows = logps.size(0);
  if (!in.advantages.defined() || in.advantages.dim() != 1 || in.advantages.size(0) != rows) {
    return absl::InvalidArgumentError("GrpoLoss: advantages must be [B]");
  }
  if (shape.world_size < 1 || shape.grad_accum_steps < 1 ||
      (opt.loss_type == GrpoLossType::kDrGrpo && opt.max_completion_length < 1)) {
    return absl::InvalidArgumentError(
        "GrpoLoss: world_size, grad_accum_steps and max_completion_length must be >= 1");
  }

  const torch::Device device = logps.device();
  const torch::ScalarType dtype = logps.scalar_type();
  const torch::Tensor mask = in.completion_mask.detach().to(device, dtype);
  const torch::Tensor adv = in.advantages.detach().to(device, dtype).unsqueeze(1);  // [B, 1]
  const torch::Tensor old = in.old_per_token_logps.defined()
                                ? in.old_per_token_logps.detach().to(device, dtype)
                                : logps.detach();

  const torch::Tensor log_ratio = logps - old;
  torch::Tensor log_w = log_ratio;
  const bool sequence = opt.importance_sampling_level == ImportanceSamplingLevel::kSequence;
  if (sequence) {
    log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).unsqueeze(-1);
  }
  const torch::Tensor coef_1 = torch::exp(log_w);
  const torch::Tensor coef_2 = torch::clamp(coef_1, 1 - opt.epsilon_low, 1 + opt.epsilon_high);
  torch::Tensor per_token_loss = -torch::min(coef_1 * adv, coef_2 * adv);  // [B, C] or [B, 1]
  torch::Tensor kl;
  if (opt.beta != 0.0) {
    const torch::Tensor d = in.ref_per_token_logps.detach().to(device, dtype) - logps;
    kl = torch::exp(d) - d - 1;
    per_token_loss = per_token_loss + opt.beta * kl;
  }
  // A sequence-level [B, 1] loss broadcasts over the row's tokens, as in TRL.
  const torch::Tensor masked_sum = (per_token_loss * mask).sum();
  const double accum = static_cast<double>(shape.world_size * shape.grad_accum_steps);

  torch::Tensor loss;
  torch::Tensor contribution;
  switch (opt.loss_type) {
    case GrpoLossType::kGrpo:
      loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).mean();
      contribution = loss / accum;
      break;
    case GrpoLossType::kBnpo:
      loss = masked_sum / mask.sum().clamp_min(1.0);
      contribution = loss / accum;
      break;
    case GrpoLossType::kDrGrpo:
      loss = masked_sum / static_cast<double>(rows * opt.max_completion_length);
      contribution = loss / accum;
      break;
    case GrpoLossType::kDapo: {
      const double tokens = std::max(shape.global_active_tokens, 1.0);
      loss = masked_sum / (tokens / static_cast<double>(shape.world_size));
      contribution = masked_sum / tokens;
      break;
    }
  }

  GrpoLossOutput out;
  out.contribution = contribution;
  out.policy_loss = ToDouble(loss);

  torch::NoGradGuard no_grad;
  const torch::Tensor active = mask.sum();
  if (kl.defined()) {
    out.stats.kl_sum = ToDouble((kl * mask).sum());
    out.stats.kl_count = ToDouble(active);
  }
  const torch::Tensor low = ((coef_1 < 1 - opt.epsilon_low) & (adv < 0)).to(dtype);
  const torch::Tensor high = ((coef_1 > 1 + opt.epsilon_high) & (adv > 0)).to(dtype);
  const torch::Tensor region = torch::clamp_max(low + high, 1.0);
  if (sequence) {  // TRL: one value per sequence, every row counted
    out.stats.clip_low_sum = ToDouble(low.sum());
    out.stats.clip_high_sum = ToDouble(high.sum());
    out.stats.clip_region_sum = ToDouble(region.sum());
    out.stats.clip_count = static_cast<double>(rows);
  } else {
    out.stats.clip_low_sum = ToDouble((low * mask).sum());
    out.stats.clip_high_sum = ToDouble((high * mask).sum());
    out.stats.clip_region_sum = ToDouble((region * mask).sum());
    out.stats.clip_count = ToDouble(active);
  }
  return out;
}

}  // namespace trainctl::trainer
