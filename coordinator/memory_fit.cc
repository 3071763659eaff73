#include "coordinator/memory_fit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/memory_plan.h"

namespace trainctl {
namespace {

bool Matches(const trainctl::v1::JobSpec& spec, const trainctl::v1::Node& node) {
  if (node.state() != "ready") return false;
  for (const auto& [key, value] : spec.node_selector()) {
    const auto it = node.labels().find(key);
    if (it == node.labels().end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<trainctl::v1::MemoryPlan> PlanForCluster(
    const trainctl::v1::JobSpec& spec, const nlohmann::json& resolved_deepspeed,
    const std::vector<trainctl::v1::Node>& nodes) {
  MemoryPlanOptions options;
  bool any = false, gpu = false;
  for (const auto& node : nodes) {
    if (!Matches(spec, node)) continue;
    any = true;
    gpu |= node.gpus() > 0;
  }
  options.cuda = !any || gpu;
  return PlanJobMemory(spec, resolved_deepspeed, options);
}

std::optional<int64_t> GpuBytesForJob(const trainctl::v1::JobSpec& spec,
                                      const std::vector<trainctl::v1::Node>& nodes) {
  std::vector<int64_t> sizes;
  const int slots = std::max(1, spec.resources().slots_per_node());
  for (const auto& node : nodes) {
    if (Matches(spec, node) && node.gpus() >= slots && node.gpu_memory_bytes() > 0) {
      sizes.push_back(node.gpu_memory_bytes());
    }
  }
  if (sizes.empty()) return std::nullopt;
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  const size_t need = static_cast<size_t>(std::max(1, spec.resources().nodes()));
  // Too few nodes is the scheduler's business (the job waits); memory is judged on the best ones.
  return sizes[std::min(need, sizes.size()) - 1];
}

absl::Status CheckMemoryFit(const trainctl::v1::JobSpec& spec,
                            const std::string& resolved_deepspeed_json,
                            const trainctl::v1::MemoryPlan& plan, int64_t gpu_bytes) {
  if (plan.device() != "cuda" || plan.gpu_bytes() <= gpu_bytes) return absl::OkStatus();
  const std::vector<std::string> remedies =
      MemoryRemedies(spec, resolved_deepspeed_json, MemoryPlanOptions{}, gpu_bytes);
  std::string message = absl::StrCat("the job's memory plan needs ", FormatBytes(plan.gpu_bytes()),
                                     " per GPU; the GPUs of the nodes it could run on hold ",
                                     FormatBytes(gpu_bytes), "\n");
  if (remedies.empty()) {
    absl::StrAppend(&message, "no single change tried fits (checkpointing, smaller micro-batches, ",
                    "ZeRO-3, offload, up to 8x the nodes)\n");
  } else {
    absl::StrAppend(&message, "changes that would fit:\n");
    for (const std::string& r : remedies) absl::StrAppend(&message, "  ", r, "\n");
  }
  absl::StrAppend(&message, FormatMemoryPlan(plan),
                  "submit with --force to queue it anyway (the plan is an estimate)");
  return absl::FailedPreconditionError(message);
}

}  // namespace trainctl
