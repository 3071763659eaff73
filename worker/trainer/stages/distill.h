// Logit distillation (stages/loop.h runs it): kind distill with training.distill_loss set. The
// student (model_name_or_path) learns a frozen teacher's next-token distributions on prepared
// data, as TRL's GKDTrainer does off-policy (lmbda 0: no student-generated sequences).
//
//   data      spec.data_path: shards written by `trainctl prepare`, dealt to the ranks as for SFT.
//   teacher   spec.teacher_model_name_or_path, built as a frozen engine (zero/engine.h) with the
//             student's options, so sharded like it. Its vocabulary size must equal the
//             student's (INVALID_ARGUMENT naming both).
//   loss      at every trained (shifted, labelled) position: kd_alpha x the divergence of
//             distill_loss (stages/distill_loss.h: forward_kl, reverse_kl or TRL's generalized
//             JSD with jsd_beta, both logits over kd_temperature) + (1 - kd_alpha) x the
//             cross-entropy on the label; summed over the global batch and divided by its
//             label-token count, as SFT.
//   events    besides the loop's loss: kd_loss and ce_loss, each the global batch's mean per
//             label token.
//
// Without distill_loss the kind means trace distillation (a teacher generating a dataset):
// stages/trace_distill.h, chosen by MakeStage.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_DISTILL_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_DISTILL_H_

#include <memory>

#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer {

std::unique_ptr<Stage> MakeDistillStage();

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_DISTILL_H_
