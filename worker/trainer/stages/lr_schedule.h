// Learning-rate schedules of the HF Trainer (transformers.get_scheduler): the multiplier of the
// peak learning rate at a step, with linear warm-up.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_LR_SCHEDULE_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace trainctl::trainer {

class LrSchedule {
 public:
  // `type`: linear | cosine | constant | constant_with_warmup. INVALID_ARGUMENT otherwise.
  static absl::StatusOr<LrSchedule> Create(const std::string& type, int64_t warmup_steps,
                                           int64_t total_steps);
  // Multiplier for the update made at optimizer step `step` (0-based), as HF's LambdaLR.
  double Factor(int64_t step) const;

 private:
  enum class Kind { kLinear, kCosine, kConstant, kConstantWithWarmup };
  LrSchedule(Kind kind, int64_t warmup, int64_t total)
      : kind_(kind), warmup_(warmup), total_(total) {}
  Kind kind_;
  int64_t warmup_;
  int64_t total_;
};

// Warm-up steps as the HF Trainer computes them: warmup_steps if > 0, else ceil(ratio * total).
int64_t WarmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_LR_SCHEDULE_H_
