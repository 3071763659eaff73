// The exit codes by which a trainer rank tells its supervisors why it stopped, where the
// coordinator can do something about it (coordinator/remedy_ladder.h). Any other non-zero code is
// a plain failure. The trainer also writes a `warning` event with a `kind` naming the cause
// (worker/trainer/trainer_failure.h), with the evidence; the code alone is what survives a lost
// event pipe.
#ifndef TRAINCTL_COMMON_TRAINER_EXIT_CODES_H_
#define TRAINCTL_COMMON_TRAINER_EXIT_CODES_H_

namespace trainctl {

// Outside sysexits.h (64..78) and the shell's 126+ (not found, signals).
// An allocation failed: CUDA out of memory, or the CPU allocator (std::bad_alloc, LibTorch's
// DefaultCPUAllocator).
inline constexpr int kTrainerExitOutOfMemory = 81;
// The loss spiked (spec.remedies.loss_spike on): stopped before the step's update and before any
// save, so the newest checkpoint predates the spike.
inline constexpr int kTrainerExitLossSpike = 82;

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_TRAINER_EXIT_CODES_H_
