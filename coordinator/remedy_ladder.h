// The automatic remedies of a job spec's `remedies:` section (common/remedies_spec.h): which one
// the coordinator applies when an attempt fails, and the spec the next attempts run with.
//
// Causes come from the exit code of the rank that failed first (common/trainer_exit_codes.h):
// - out of memory (spec.remedies.oom): the next step of the ladder not in force yet —
//   1. gradient_checkpointing on;
//   2. half the micro-batch with twice the accumulation (global batch unchanged), when the
//      micro-batch is even, and only once;
//   3. the optimizer state offloaded to the CPU (DeepSpeed zero_optimization.offload_optimizer),
//      when the job has a DeepSpeed config at ZeRO stage >= 1.
//   With AttemptFailure::fits, a step whose memory plan still does not fit is not tried alone:
//   the remedy takes the steps up to the first whose plan fits, all at once (none fits: the next
//   step alone, as without a plan).
// - a loss spike (spec.remedies.loss_spike): roll back to the last complete checkpoint (what every
//   restart does) with max_grad_norm lowered to, and warmup_ratio raised to, the spec's
//   LossSpikeRemedy values (0.5 and 0.1 by default; a job's own lower clipping or longer warm-up
//   is kept), at most max_rollbacks times.
// Nothing else has a remedy. Pure functions, thread-safe.
#ifndef TRAINCTL_COORDINATOR_REMEDY_LADDER_H_
#define TRAINCTL_COORDINATOR_REMEDY_LADDER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

using Remedies = google::protobuf::RepeatedPtrField<trainctl::v1::Remedy>;

// Why an attempt failed, as far as remedies care.
struct AttemptFailure {
  int attempt = 0;                   // the attempt that failed
  int exit_code = 0;                 // of the rank that failed first; -1 for a signal
  int rank = -1;                     // that rank, -1 unknown
  std::string detail;                // its evidence (the rank's last log line)
  int64_t last_checkpoint_step = 0;  // the checkpoint the next attempt resumes from; 0 none
  // Whether a spec's memory plan fits the GPUs the job ran on (coordinator/memory_fit.h); unset
  // when that is not known (CPU nodes, a model the coordinator has no config for).
  std::function<bool(const trainctl::v1::JobSpec&)> fits;
};

// "oom" | "loss_spike" for the trainer exit codes that have a cause, else "".
std::string FailureCause(int exit_code);

// The remedy for `failure` given the job's validated `spec` and the remedies applied so far
// (`prior`, oldest first), for attempt failure.attempt + 1; nullopt when the spec does not ask for
// one, the cause has none, or its ladder is exhausted.
std::optional<trainctl::v1::Remedy> NextRemedy(const trainctl::v1::JobSpec& spec,
                                               const Remedies& prior,
                                               const AttemptFailure& failure);

// `spec` with every remedy's settings applied in order: the training arguments, and the DeepSpeed
// document's keys that would otherwise contradict them (an explicit gradient_clipping, micro-batch
// or accumulation) or that carry the change (offload_optimizer). INVALID_ARGUMENT for a setting it
// does not know or a value it cannot parse.
absl::StatusOr<trainctl::v1::JobSpec> ApplyRemedies(const trainctl::v1::JobSpec& spec,
                                                    const Remedies& remedies);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_REMEDY_LADDER_H_
