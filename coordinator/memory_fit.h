// Whether a job's memory plan (common/memory_plan.h) fits the GPUs of the nodes it could run on,
// at submit (JobManager::Submit) and when an out-of-memory remedy is chosen (the remedy ladder).
#ifndef TRAINCTL_COORDINATOR_MEMORY_FIT_H_
#define TRAINCTL_COORDINATOR_MEMORY_FIT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// The plan of a validated job as the coordinator makes it: for GPUs, or for CPU ranks when every
// node that could take the job is a CPU node (`nodes`: what ListNodes answers; empty: GPUs).
// NOT_FOUND when a model's config is not known here.
absl::StatusOr<trainctl::v1::MemoryPlan> PlanForCluster(
    const trainctl::v1::JobSpec& spec, const nlohmann::json& resolved_deepspeed,
    const std::vector<trainctl::v1::Node>& nodes);

// The GPU memory (bytes, the smallest GPU's) a job's ranks would get on the nodes that match its
// node_selector and have its slots_per_node GPUs, taking the spec's node count from the largest:
// nullopt when no ready GPU node matches (nothing to check against).
std::optional<int64_t> GpuBytesForJob(const trainctl::v1::JobSpec& spec,
                                      const std::vector<trainctl::v1::Node>& nodes);

// FAILED_PRECONDITION when `plan` needs more per GPU than `gpu_bytes`: what it needs and what the
// GPUs hold, the cheapest changes to the spec that would fit (MemoryRemedies), the plan's table,
// and that --force submits it anyway.
absl::Status CheckMemoryFit(const trainctl::v1::JobSpec& spec,
                            const std::string& resolved_deepspeed_json,
                            const trainctl::v1::MemoryPlan& plan, int64_t gpu_bytes);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_MEMORY_FIT_H_
