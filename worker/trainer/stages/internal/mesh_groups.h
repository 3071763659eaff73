// The device mesh of a job (common/parallelism_spec.h) made real on one rank: the communicators
// of its sequence-parallel, tensor-parallel and ZeRO groups (sub-groups of the job's), and the
// model's exchanges over them (model/sequence_parallel.h, model/tensor_parallel.h).
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_MESH_GROUPS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_MESH_GROUPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/parallelism_spec.h"
#include "trainctl/v1/job.pb.h"
#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/tensor_parallel.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::trainer::internal {

struct MeshGroups {
  DeviceMesh mesh;
  std::unique_ptr<zero::Comm> sequence;  // null when sequence == 1
  std::unique_ptr<zero::Comm> tensor;    // null when tensor == 1
  std::unique_ptr<zero::Comm> zero;  // the ranks with this tensor position; null when tensor == 1
  std::shared_ptr<model::SequenceParallel> sequence_parallel;  // null when sequence == 1
  std::shared_ptr<model::TensorParallel> tensor_parallel;      // null when tensor == 1

  MeshGroups() = default;
  MeshGroups(MeshGroups&&) = default;
  MeshGroups& operator=(MeshGroups&&) = default;
  ~MeshGroups() { Release(); }
  // Drops the sub-groups, leaking those whose collectives failed, as Comm::failed asks. Before
  // the job's Comm goes: they are its sub-groups.
  void Release();

  // The engine's part: tensor parallelism and the group ZeRO shards over.
  void ApplyTo(zero::EngineOptions* options) const;
  // The model's part (after the engine built it): the sequence-parallel exchange.
  void ApplyTo(model::Qwen2VLForConditionalGeneration* model) const;
  bool failed() const;
};

// OK when the mesh's sequence-parallel size divides the attention heads of `config`'s model that
// a rank holds: all of them, or its tensor-parallel share when `attention_split` (and tensor
// parallelism divides them; else the engine refuses the model). INVALID_ARGUMENT naming `whose`
// ("the model", "the teacher (<name>)") and the numbers otherwise.
absl::Status CheckSequenceSplitsHeads(const model::Qwen2VLConfig& config, const DeviceMesh& mesh,
                                      bool attention_split, const std::string& whose);

// The groups of `spec`'s mesh over `world` (collective: every rank calls it in the same order).
// INVALID_ARGUMENT, naming the numbers, when the mesh does not divide the world, the model's
// attention heads (sequence) or its MLP width (tensor).
absl::StatusOr<MeshGroups> OpenMeshGroups(const trainctl::v1::JobSpec& spec, zero::Comm& world,
                                          const model::Qwen2VLConfig& config);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_MESH_GROUPS_H_
