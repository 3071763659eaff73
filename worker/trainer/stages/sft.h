// Supervised fine-tuning (stages/loop.h runs it): the HF Trainer's step for Qwen2-VL.
//
//   data      spec.data_path: shards written by `trainctl prepare`, dealt to the ranks by the
//             loader (data/loader.h), per_device_train_batch_size rows per micro-batch.
//   loss      the mean cross-entropy over the assistant tokens of the whole global batch: every
//             micro-batch's summed loss divided by the global batch's label-token count, so N
//             ranks compute what one rank would on the same samples.
//   precision bf16 autocast when training.bf16 (fp32 master weights and optimizer state).
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_SFT_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_SFT_H_

#include <memory>

#include "worker/trainer/stages/loop.h"

namespace trainctl::trainer {

std::unique_ptr<Stage> MakeSftStage();

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_SFT_H_
