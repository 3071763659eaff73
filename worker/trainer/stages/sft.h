// Supervised fine-tuning on one rank: the HF Trainer's loop for Qwen2-VL, driven by a JobSpec.
//
//   model     spec.model_name_or_path: an HF directory (config.json + safetensors) is loaded;
//             a registry name ("tiny") or a bare config is initialised from spec.training.seed.
//   data      spec.data_path: shards written by `trainctl prepare`.
//   optimiser AdamW (no weight decay on biases and norms), linear/cosine/constant schedule with
//             warm-up, gradient clipping by global norm, gradient accumulation; the loss is the
//             mean cross-entropy over the assistant tokens of the whole global batch (every
//             micro-batch's summed loss divided by the global batch's label-token count).
//   precision bf16 autocast when spec.training.bf16 (fp32 master weights and optimizer state).
//   output    metric events every logging_steps; checkpoints per save_strategy
//   (trainer_checkpoint.h)
//             under spec.output_dir; resumes from the latest complete one there.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_SFT_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_SFT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"
#include "worker/trainer/event_sink.h"

namespace trainctl::trainer {

struct SftRun {
  trainctl::v1::JobSpec spec;  // validated, defaults applied (common/job_spec.h)
  bool resume = true;          // continue from the newest complete checkpoint in output_dir
};

struct SftResult {
  int64_t steps = 0;            // optimizer steps done in total (including before a resume)
  int64_t resumed_from = 0;     // the step resumed from; 0 for a fresh start
  double last_loss = 0;         // loss of the last optimizer step
  std::string last_checkpoint;  // empty when none was written
};

// Trains to the end. INVALID_ARGUMENT / NOT_FOUND / DATA_LOSS for a bad model, data or
// checkpoint (naming it); INTERNAL with LibTorch's message if a tensor operation fails.
absl::StatusOr<SftResult> RunSft(const SftRun& run, EventSink* events);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_SFT_H_
