#include "worker/trainer/stages/distill_loss.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace trainctl::trainer {
namespace {

torch::Tensor LogProbs(const torch::Tensor& logits, double temperature) {
  return torch::log_softmax(logits.to(torch::kFloat32) / temperature, /*dim=*/-1);
}

// sum over rows and vocabulary of p * (log p - log q), from log-probabilities.
torch::Tensor KlSum(const torch::Tensor& log_p, const torch::Tensor& log_q) {
  return (log_p.exp() * (log_p - log_q)).sum();
}

}  // namespace

absl::StatusOr<DistillLossType> ParseDistillLossType(const std::string& name) {
  if (name == "forward_kl") return DistillLossType::kForwardKl;
  if (name == "reverse_kl") return DistillLossType::kReverseKl;
  if (name == "jsd") return DistillLossType::kJsd;
  return absl::InvalidArgumentError(absl::StrCat(
      "training.distill_loss: must be one of forward_kl|reverse_kl|jsd, got '", name, "'"));
}

torch::Tensor ForwardKlSum(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits,
                           double temperature) {
  return KlSum(LogProbs(teacher_logits, temperature), LogProbs(student_logits, temperature));
}

torch::Tensor ReverseKlSum(const torch::Tensor& student_logits, const torch::Tensor& teacher_logits,
                           double temperature) {
  return KlSum(LogProbs(student_logits, temperature), LogProbs(teacher_logits, temperature));
}

torch::Tensor GeneralizedJsdSum(const torch::Tensor& student_logits,
                                const torch::Tensor& teacher_logits, double beta,
                                double temperature) {
  if (beta == 0) return ForwardKlSum(student_logits, teacher_logits, temperature);
  if (beta == 1) return ReverseKlSum(student_logits, teacher_logits, temperature);
  const torch::Tensor log_s = LogProbs(student_logits, temperature);
  const torch::Tensor log_t = LogProbs(teacher_logits, temperature);
  // log M = log((1 - beta) e^log_s + beta e^log_t), stably.
  const torch::Tensor log_m =
      torch::logsumexp(torch::stack({log_s + std::log1p(-beta), log_t + std::log(beta)}), 0);
  return beta * KlSum(log_t, log_m) + (1 - beta) * KlSum(log_s, log_m);
}

torch::Tensor DistillLossSum(const torch::Tensor& student_logits,
                             const torch::Tensor& teacher_logits,
                             const DistillLossOptions& options) {
  switch (options.type) {
    case DistillLossType::kForwardKl:
      return ForwardKlSum(student_logits, teacher_logits, options.temperature);
    case DistillLossType::kReverseKl:
      return ReverseKlSum(student_logits, teacher_logits, options.temperature);
    case DistillLossType::kJsd:
      break;
  }
  return GeneralizedJsdSum(student_logits, teacher_logits, options.beta, options.temperature);
}

}  // namespace trainctl::trainer
