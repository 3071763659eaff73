// Why a trainer run failed, where the coordinator has a remedy for it (common/trainer_exit_codes.h,
// coordinator/remedy_ladder.h): out of memory, recognised from the allocator's message, and a loss
// spike, which the loop reports as a status carrying a marker. Torch-free.
#ifndef TRAINCTL_WORKER_TRAINER_TRAINER_FAILURE_H_
#define TRAINCTL_WORKER_TRAINER_TRAINER_FAILURE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl::trainer {

struct OutOfMemory {
  int64_t bytes = -1;  // the allocation that failed, -1 unknown
  std::string device;  // "cuda" or "cpu"
};

// An out-of-memory error in `message` (a status message or exception text): CUDA's "CUDA out of
// memory. Tried to allocate 2.00 GiB ...", LibTorch's CPU allocator ("DefaultCPUAllocator: can't
// allocate memory: you tried to allocate N bytes", 1.13 and 2.x), std::bad_alloc's what().
// nullopt otherwise.
std::optional<OutOfMemory> ParseOutOfMemory(absl::string_view message);

// A status saying the loss spiked (RESOURCE_EXHAUSTED is not it: ABORTED, with a payload that
// IsLossSpike finds whatever context is added to the message later).
absl::Status LossSpikeError(absl::string_view evidence);
bool IsLossSpike(const absl::Status& status);

// The process exit code for a failed run: kTrainerExitLossSpike, kTrainerExitOutOfMemory, else 1.
int TrainerExitCode(const absl::Status& status);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_TRAINER_FAILURE_H_
