// Logit distillation's divergences between a student's and a teacher's next-token distributions,
// as pure tensor functions over the trained (labelled) positions.
//
// Each takes logits [N, V] of the same N positions and vocabulary, divides both by `temperature`,
// takes log-softmax over V in fp32 and returns the divergence SUMMED over the N positions (a
// scalar; the stage divides by the global label-token count, as SFT does). Gradients flow into
// both arguments; callers pass teacher logits computed without autograd.
//
// The generalized JSD is TRL's GKDTrainer.generalized_jsd_loss (trl/experimental/gkd/
// gkd_trainer.py, main at f2cd577), Eq. (1) of Agarwal et al. 2023 (arXiv 2306.13649):
//   M   = (1 - beta) * P_student + beta * P_teacher
//   JSD = beta * KL(P_teacher || M) + (1 - beta) * KL(P_student || M)
// with beta == 0 taken as forward KL(P_teacher || P_student) and beta == 1 as reverse
// KL(P_student || P_teacher), as TRL special-cases them (the formula itself goes to 0 at both
// ends, scaled by beta resp. 1 - beta).
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_DISTILL_LOSS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_DISTILL_LOSS_H_

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"

namespace trainctl::trainer {

enum class DistillLossType { kForwardKl, kReverseKl, kJsd };

// "forward_kl" | "reverse_kl" | "jsd"; INVALID_ARGUMENT naming training.distill_loss otherwise.
absl::StatusOr<DistillLossType> ParseDistillLossType(const std::string& name);

struct DistillLossOptions {
  DistillLossType type = DistillLossType::kJsd;
  double beta = 0.5;         // jsd only, in [0, 1]
  double temperature = 1.0;  // > 0
};

// sum_n KL(teacher_n || student_n): mode-covering; what SFT on teacher samples approximates.
torch::Tensor ForwardKlSum(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits,
                           double temperature);
// sum_n KL(student_n || teacher_n): mode-seeking.
torch::Tensor ReverseKlSum(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits,
                           double temperature);
// sum_n JSD_beta(student_n, teacher_n) as above.
torch::Tensor GeneralizedJsdSum(const torch::Tensor& student_logits,
                                const torch::Tensor& teacher_logits, double beta,
                                double temperature);

// The divergence `options` choose.
torch::Tensor DistillLossSum(const torch::Tensor& student_logits,
                             const torch::Tensor& teacher_logits,
                             const DistillLossOptions& options);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_DISTILL_LOSS_H_
