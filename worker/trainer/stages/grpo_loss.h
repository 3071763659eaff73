// GRPO's advantages and clipped-surrogate loss as pure tensor functions, following TRL's
// GRPOTrainer (huggingface/trl at f2cd57710ae345ea6428ae95363267fcf38a3dc8, 1.10.0.dev0:
// `_generate_and_score_completions` for advantages, `_compute_loss` for the loss and its metrics).
//
// TRL defaults (GRPOConfig): loss_type dapo, beta 0.0, epsilon 0.2 (epsilon_high = epsilon when
// unset), scale_rewards group, num_iterations 1, importance_sampling_level token,
// mask_truncated_completions false, temperature 1.0, top_p 1.0, top_k 0 (off), num_generations 8,
// max_completion_length 512, steps_per_generation = gradient_accumulation_steps.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_GRPO_LOSS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_GRPO_LOSS_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::trainer {

enum class ScaleRewards { kGroup, kBatch, kNone };
enum class GrpoLossType { kGrpo, kBnpo, kDrGrpo, kDapo };
enum class ImportanceSamplingLevel { kToken, kSequence };

// "group" | "batch" | "none"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ScaleRewards> ParseScaleRewards(absl::string_view name);
// "grpo" | "bnpo" | "dr_grpo" | "dapo"; INVALID_ARGUMENT otherwise.
absl::StatusOr<GrpoLossType> ParseGrpoLossType(absl::string_view name);
// "token" | "sequence"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ImportanceSamplingLevel> ParseImportanceSamplingLevel(absl::string_view name);

struct Advantages {
  torch::Tensor advantages;  // [N] float32, CPU
  double reward_mean = 0;    // TRL "reward": nanmean of all rewards
  double reward_std = 0;     // TRL "reward_std": unbiased std of ALL N rewards (not of groups)
  double frac_reward_zero_std = 0;  // TRL "frac_reward_zero_std", see ComputeAdvantages
};

// Advantages of one generation batch, `rewards` [N] (any float dtype, any device) holding every
// rank's rewards, groups of `num_generations` consecutive completions of one prompt. As TRL:
//   A = r - mean(group); group: A /= (std(group) + 1e-4); batch: A /= (std(all N) + 1e-4);
//   none: no division. std is Bessel-corrected (unbiased) and NaN when fewer than 2 values.
// NaN rewards (unscorable completions) are left out of means and stds and get advantage 0, as do
// completions whose divisor is NaN. frac_reward_zero_std is the fraction of the N completions whose
// divisor std (the group's for group/none, the batch's for batch) is within 1e-8 of zero.
// INVALID_ARGUMENT when rewards is not 1-D or N is not a positive multiple of num_generations.
absl::StatusOr<Advantages> ComputeAdvantages(const torch::Tensor& rewards, int64_t num_generations,
                                             ScaleRewards scale);

struct GrpoLossOptions {
  GrpoLossType loss_type = GrpoLossType::kDapo;
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;
  double beta = 0.0;
  ImportanceSamplingLevel importance_sampling_level = ImportanceSamplingLevel::kToken;
  int64_t max_completion_length = 512;  // dr_grpo's constant normaliser
};

// How one optimizer step's global batch is split. Our ZeRO engine SUMS gradients over ranks and
// micro-batches; TRL's objective is DDP's AVERAGE over processes of each process's accumulated
// micro-batch losses, each divided by gradient_accumulation_steps (grpo/bnpo/dr_grpo) or by
// num_items_in_batch / num_processes (dapo, with no accumulation division).
struct GrpoStepShape {
  int64_t world_size = 1;
  int64_t grad_accum_steps = 1;
  // dapo only: TRL's num_items_in_batch, the active (mask == 1) completion tokens of the whole
  // generation batch over all ranks, after mask_truncated_completions zeroed truncated rows. With
  // TRL's default steps_per_generation == gradient_accumulation_steps that is every micro-batch of
  // this optimizer step on every rank. The caller all-reduces it; values below 1 count as 1.
  double global_active_tokens = 0;
};

// Detached sums and counts, so micro-batches and ranks aggregate by adding (then all-reduce).
struct GrpoLossStats {
  double kl_sum = 0;  // masked sum of the k3 KL; only when beta != 0
  double kl_count = 0;
  double clip_low_sum = 0;     // (coef_1 < 1 - eps_low) & (A < 0)
  double clip_high_sum = 0;    // (coef_1 > 1 + eps_high) & (A > 0)
  double clip_region_sum = 0;  // either
  // Token level: active tokens. Sequence level: rows (TRL counts every row there, even masked).
  double clip_count = 0;

  void Add(const GrpoLossStats& other);
  // TRL's metrics: sum / max(count, 1).
  double KlMean() const;
  double ClipLowMean() const;
  double ClipHighMean() const;
  double ClipRegionMean() const;
};

struct GrpoLossInputs {
  torch::Tensor per_token_logps;      // [B, C], requires grad; its dtype is the compute dtype
  torch::Tensor old_per_token_logps;  // [B, C] or undefined: per_token_logps.detach() (ratio 1)
  torch::Tensor ref_per_token_logps;  // [B, C]; required iff beta != 0
  torch::Tensor advantages;           // [B]
  torch::Tensor completion_mask;      // [B, C] bool/int/float, 1 = token in the loss
};

struct GrpoLossOutput {
  // The micro-batch's share of the step objective, with grad; see the invariant below.
  torch::Tensor contribution;
  // TRL's `policy_loss` of this micro-batch (before its gradient-accumulation division).
  double policy_loss = 0;
  GrpoLossStats stats;
};

// The clipped surrogate with k3 KL for one micro-batch on one rank, exactly as TRL's _compute_loss:
//   log_ratio = logps - old; token: liw = log_ratio; sequence: liw = masked mean of log_ratio per
//   row ([B, 1], denominator clamped to >= 1); coef_1 = exp(liw);
//   coef_2 = clamp(coef_1, 1 - eps_low, 1 + eps_high); d = ref - logp;
//   l = -min(coef_1 A, coef_2 A) + beta (exp(d) - d - 1); m = completion_mask;
//   grpo: mean over rows of sum(l m) / max(sum(m), 1) per row;
//   bnpo: sum(l m) / max(sum(m), 1);
//   dr_grpo: sum(l m) / (B max_completion_length);
//   dapo: sum(l m) / (max(N, 1) / world_size).
// contribution = that loss / (world_size * grad_accum_steps) for grpo, bnpo, dr_grpo, and
// sum(l m) / max(N, 1) for dapo, where N = shape.global_active_tokens.
// INVARIANT: the SUM over all ranks and micro-batches of one optimizer step of `contribution`
// equals TRL's objective for that global batch, (1/P) sum_ranks sum_micro (TRL micro-batch loss /
// G) for grpo/bnpo/dr_grpo and (1/P) sum_ranks sum_micro TRL micro-batch loss for dapo, so summed
// gradients equal DDP's averaged, accumulated ones. Hence "2 ranks x 1 micro-batch" and "1 rank x
// 2 micro-batches" give the same sum; it also equals the single-batch TRL loss over all rows for
// grpo and dr_grpo with equal-sized micro-batches and for dapo always, but not for bnpo (TRL
// normalises bnpo per micro-batch).
// INVALID_ARGUMENT on shape mismatches, a missing reference with beta != 0, or bad shape values.
absl::StatusOr<GrpoLossOutput> GrpoLoss(const GrpoLossInputs& inputs,
                                        const GrpoLossOptions& options, const GrpoStepShape& shape);

// Active completion tokens of `completion_mask` (after any truncation masking): this rank's part
// of GrpoStepShape::global_active_tokens.
double ActiveTokens(const torch::Tensor& completion_mask);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_GRPO_LOSS_H_
