// The `remedies:` section of a job spec (RemediesSpec in proto/trainctl/v1/diagnostics.proto): its
// defaults and checks, called by ValidateJobSpec (common/job_spec.h). Off unless set:
//
//   remedies:
//     oom: true          # on out of memory: gradient checkpointing, then half the micro-batch
//                        # with twice the accumulation, then optimizer offload to the CPU
//     loss_spike: {}     # on a loss spike: roll back to the last checkpoint with max_grad_norm 0.5
//                        # and warmup_ratio 0.1 (spike_factor, window, max_rollbacks, ... optional)
//
// The coordinator applies them (coordinator/remedy_ladder.h); each restart they cause counts
// against max_restarts. Pure functions, thread-safe.
#ifndef TRAINCTL_COMMON_REMEDIES_SPEC_H_
#define TRAINCTL_COMMON_REMEDIES_SPEC_H_

#include <string>
#include <vector>

#include "common/internal/spec_checker.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// LossSpikeRemedy's defaults (the seed's troubleshooting values for the last two).
inline constexpr double kDefaultSpikeFactor = 3.0;
inline constexpr int kDefaultSpikeWindow = 20;
inline constexpr int kDefaultMaxRollbacks = 2;
inline constexpr double kDefaultSpikeMaxGradNorm = 0.5;
inline constexpr double kDefaultSpikeWarmupRatio = 0.1;

// Makes every default of a set loss_spike explicit, and oom false when unset. A spec without a
// remedies section is left without one.
void ApplyRemediesDefaults(trainctl::v1::JobSpec* spec);

// Errors name the field ("spec.remedies.loss_spike.window: must be >= 3, got 1"); `warnings` gets
// why a remedy can never run (max_restarts 0).
void CheckRemedies(const trainctl::v1::JobSpec& spec, internal::Checker& c,
                   std::vector<std::string>* warnings);

// The line a remedy is shown as (describe, watch, the restart reason):
// "attempt 2: OOM on rank 3 → gradient_checkpointing on".
std::string RemedyLine(const trainctl::v1::Remedy& remedy);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_REMEDIES_SPEC_H_
