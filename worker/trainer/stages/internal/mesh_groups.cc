#include "worker/trainer/stages/internal/mesh_groups.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer/zero/sequence_all_to_all.h"

namespace trainctl::trainer::internal {

void MeshGroups::Release() {
  zero::ReleaseIfFailed(sequence);
  zero::ReleaseIfFailed(tensor);
  zero::ReleaseIfFailed(zero);
}

bool MeshGroups::failed() const {
  for (const auto* comm : {&sequence, &tensor, &zero}) {
    if (*comm && (*comm)->failed()) return true;
  }
  return false;
}

void MeshGroups::ApplyTo(zero::EngineOptions* options) const {
  options->tensor_parallel = tensor_parallel;
  options->zero_group = zero.get();
}

void MeshGroups::ApplyTo(model::Qwen2VLForConditionalGeneration* model) const {
  if (sequence_parallel) model->SetSequenceParallel(sequence_parallel);
}

namespace {

// The MLP width, heads and vocabulary tensor parallelism splits are the engine's to check
// (zero/engine.cc Build), for every model it builds, frozen ones included. Sequence parallelism
// splits the heads a rank holds: all of them, or its tensor-parallel share.
absl::Status CheckMeshFits(const trainctl::v1::JobSpec& spec, const DeviceMesh& mesh, int world,
                           const model::Qwen2VLConfig& config) {
  if (mesh.world() != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism: sequence_parallel_size ", mesh.sequence, " x tensor_parallel_size ",
        mesh.tensor, " does not divide the world size ", world));
  }
  return CheckSequenceSplitsHeads(config, mesh, TensorParallelSplitsAttention(spec), "the model");
}

// The tensor-parallel group's sums and gathers for the model and the engine. Collectives run on
// the group's device; a failure is thrown as a c10::Error, which the model's callers turn into
// a status (model/status_guard.h).
std::shared_ptr<model::TensorParallel> TensorParallelOver(zero::Comm* group, const DeviceMesh& mesh,
                                                          int rank) {
  auto tp = std::make_shared<model::TensorParallel>();
  tp->size = mesh.tensor;
  tp->rank = mesh.TensorRank(rank);
  tp->all_reduce = [group](torch::Tensor& x) {
    TORCH_CHECK(x.is_contiguous(), "tensor-parallel sum of a non-contiguous tensor");
    group->AllReduce(x, "tensor-parallel sum").Wait();
  };
  tp->all_gather = [group](const torch::Tensor& x) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] *= group->world_size();
    torch::Tensor out = torch::empty(shape, x.options());
    group->AllGather(x.contiguous(), out, "tensor-parallel gather").Wait();
    return out;
  };
  return tp;
}

}  // namespace

absl::Status CheckSequenceSplitsHeads(const model::Qwen2VLConfig& config, const DeviceMesh& mesh,
                                      bool attention_split, const std::string& whose) {
  // Heads tensor parallelism cannot split are the engine's to name.
  const int64_t heads = config.num_attention_heads;
  const int64_t held = HeadsPerTensorRank(heads, mesh.tensor, attention_split);
  if (held % mesh.sequence == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "parallelism.sequence_parallel_size ", mesh.sequence, " does not divide ", whose, "'s ",
      heads, " attention heads",
      held != heads
          ? absl::StrCat(" / tensor_parallel_size ", mesh.tensor, kTensorParallelMlpOnlyHint)
          : ""));
}

absl::StatusOr<MeshGroups> OpenMeshGroups(const trainctl::v1::JobSpec& spec, zero::Comm& world,
                                          const model::Qwen2VLConfig& config) {
  MeshGroups g;
  g.mesh = MeshOf(spec, world.world_size());
  RETURN_IF_ERROR(CheckMeshFits(spec, g.mesh, world.world_size(), config));
  const int rank = world.rank();
  if (g.mesh.sequence > 1) {
    ASSIGN_OR_RETURN(g.sequence, world.Subgroup(g.mesh.SequenceGroup(rank), "sequence"));
    g.sequence_parallel = std::make_shared<model::SequenceParallel>();
    g.sequence_parallel->size = g.mesh.sequence;
    g.sequence_parallel->rank = g.mesh.SequenceRank(rank);
    zero::Comm* group = g.sequence.get();
    g.sequence_parallel->all_to_all = [group](const torch::Tensor& x, int64_t scatter,
                                              int64_t gather) {
      return zero::SequenceAllToAll(*group, x, scatter, gather);
    };
  }
  if (g.mesh.tensor > 1) {
    ASSIGN_OR_RETURN(g.tensor, world.Subgroup(g.mesh.TensorGroup(rank), "tensor"));
    ASSIGN_OR_RETURN(g.zero, world.Subgroup(g.mesh.ZeroGroup(rank), "zero"));
    g.tensor_parallel = TensorParallelOver(g.tensor.get(), g.mesh, rank);
    g.tensor_parallel->vocab_parallel = spec.parallelism().vocab_parallel();
    g.tensor_parallel->attention = TensorParallelSplitsAttention(spec);
  }
  return g;
}

}  // namespace trainctl::trainer::internal
