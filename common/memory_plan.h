// A job's memory plan: from its validated spec alone, the bytes each rank's device holds at the
// job's busiest moment, by part, and the bytes each node's host memory holds (offloaded states),
// so that `trainctl validate` and `submit` can say whether the job fits before it waits in the
// queue and loads for minutes. The formulas are in docs/memory-plan.md; in short, for Ψ
// parameters over W ranks at ZeRO stage 3, the trained model's fp32 master weights, AdamW moments
// and fp32 gradient slices are 4 + 8 + 4 = 16 Ψ / W bytes (the ZeRO paper's 12Ψ optimizer share,
// its 2Ψ of 16-bit gradients kept in fp32 here, its 2Ψ of 16-bit weights gathered one unit at a
// time), activations follow the layer's saved tensors per token, and GRPO adds a rollout phase
// (the gathered weights and the KV cache). DeepSpeed's own estimator (model states only) is
// computed beside it for comparison. No LibTorch: the coordinator and the CLI plan too.
#ifndef TRAINCTL_COMMON_MEMORY_PLAN_H_
#define TRAINCTL_COMMON_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_catalog.h"
#include "nlohmann/json.hpp"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

struct MemoryPlanOptions {
  // Where named model configs are looked up (LookupModelShape; "" the source tree's).
  std::string registry;
  // The ranks' device: GPUs ("cuda": fused kernels and flash attention, the CUDA runtime and NCCL
  // buffers) or CPU slots ("cpu": composite ops, eager attention; gpu_bytes is then host memory).
  bool cuda = true;
};

// The plan of one validated job (ValidateJobSpec's spec and resolved DeepSpeed config; a
// pipeline: every stage planned, the largest kept, named in `stage`). NOT_FOUND when a model's
// config is not known here (LookupModelShape's message).
absl::StatusOr<trainctl::v1::MemoryPlan> PlanJobMemory(const trainctl::v1::JobSpec& spec,
                                                       const std::string& resolved_deepspeed_json,
                                                       const MemoryPlanOptions& options);
// The same with the resolved config parsed (ValidatedJobSpec::resolved_deepspeed_config; null or
// empty: none), which saves a submit its parse.
absl::StatusOr<trainctl::v1::MemoryPlan> PlanJobMemory(const trainctl::v1::JobSpec& spec,
                                                       const nlohmann::json& resolved_deepspeed,
                                                       const MemoryPlanOptions& options);

// DeepSpeed's estimate_zero3_model_states_mem_needs / estimate_zero2_model_states_mem_needs
// (deepspeed/runtime/zero/stage3.py, stage_1_and_2.py), zero_init on, additional_buffer_factor
// 1.5, the same arithmetic: per GPU and per node bytes of model states. Stages 0 and 1 use stage
// 2's formula, as DeepSpeed offers none for them.
struct DeepSpeedEstimate {
  int64_t gpu_bytes = 0;
  int64_t cpu_bytes = 0;
};
DeepSpeedEstimate EstimateDeepSpeedModelStates(int stage, int64_t total_params,
                                               int64_t largest_layer_params, int gpus_per_node,
                                               int nodes, bool offload_optimizer,
                                               bool offload_param);

// The cheapest changes to `spec` whose plan fits `gpu_bytes` per rank, in the order a user would
// try them: gradient checkpointing; half the micro-batch with twice the accumulation (down to 1);
// ZeRO stage 3; the optimizer offloaded; the parameters offloaded too; twice the nodes (up to 8x).
// Each line says the change and the plan's total with it; at most `limit` lines, empty when
// nothing tried fits.
std::vector<std::string> MemoryRemedies(const trainctl::v1::JobSpec& spec,
                                        const std::string& resolved_deepspeed_json,
                                        const MemoryPlanOptions& options, int64_t gpu_bytes,
                                        int limit = 3);
std::vector<std::string> MemoryRemedies(const trainctl::v1::JobSpec& spec,
                                        const nlohmann::json& resolved_deepspeed,
                                        const MemoryPlanOptions& options, int64_t gpu_bytes,
                                        int limit = 3);

// The plan as a table: one row per part, the per-rank device and per-node host columns, the
// totals, DeepSpeed's estimate and the assumptions.
std::string FormatMemoryPlan(const trainctl::v1::MemoryPlan& plan);

// "12.3 GiB", "640 MiB", "12 KiB".
std::string FormatBytes(int64_t bytes);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_MEMORY_PLAN_H_
