#include "worker/trainer/stages/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace trainctl::trainer {

absl::StatusOr<LrSchedule> LrSchedule::Create(const std::string& type, int64_t warmup_steps,
                                              int64_t total_steps) {
  if (warmup_steps < 0 || total_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule needs warmup >= 0 and total >= 1, got ", warmup_steps, " and ", total_steps));
  }
  Kind kind;
  if (type == "linear") {
    kind = Kind::kLinear;
  } else if (type == "cosine") {
    kind = Kind::kCosine;
  } else if (type == "constant") {
    kind = Kind::kConstant;
  } else if (type == "constant_with_warmup") {
    kind = Kind::kConstantWithWarmup;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "lr_scheduler_type '", type,
        "' is not supported by the trainer (linear|cosine|constant|constant_with_warmup)"));
  }
  return LrSchedule(kind, warmup_steps, total_steps);
}

double LrSchedule::Factor(int64_t step) const {
  if (kind_ == Kind::kConstant) return 1.0;
  if (step < warmup_) return static_cast<double>(step) / std::max<int64_t>(1, warmup_);
  const double progress =
      static_cast<double>(step - warmup_) / std::max<int64_t>(1, total_ - warmup_);
  switch (kind_) {
    case Kind::kLinear:
      return std::max(0.0,
                      static_cast<double>(total_ - step) / std::max<int64_t>(1, total_ - warmup_));
    case Kind::kCosine:
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    default:
      return 1.0;
  }
}

int64_t WarmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

}  // namespace trainctl::trainer
