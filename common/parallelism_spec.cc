#include "common/parallelism_spec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model_catalog.h"

namespace trainctl {

std::vector<int> DeviceMesh::SequenceGroup(int rank) const {
  std::vector<int> group;
  const int first = DataRank(rank) * sequence * tensor + TensorRank(rank);
  for (int i = 0; i < sequence; ++i) group.push_back(first + i * tensor);
  return group;
}

std::vector<int> DeviceMesh::TensorGroup(int rank) const {
  std::vector<int> group;
  const int first = rank - TensorRank(rank);
  for (int i = 0; i < tensor; ++i) group.push_back(first + i);
  return group;
}

std::vector<int> DeviceMesh::ZeroGroup(int rank) const {
  std::vector<int> group;
  for (int r = TensorRank(rank); r < world(); r += tensor) group.push_back(r);
  return group;
}

DeviceMesh MeshOf(const trainctl::v1::JobSpec& spec, int world) {
  DeviceMesh mesh;
  const auto& p = spec.parallelism();
  mesh.tensor = p.has_tensor_parallel_size() ? std::max(1, p.tensor_parallel_size()) : 1;
  mesh.sequence = p.has_sequence_parallel_size() ? std::max(1, p.sequence_parallel_size()) : 1;
  mesh.data = std::max(1, world / (mesh.tensor * mesh.sequence));
  return mesh;
}

bool TensorParallelSplitsAttention(const trainctl::v1::JobSpec& spec) {
  const auto& p = spec.parallelism();
  return p.has_tensor_parallel_size() && p.tensor_parallel_size() > 1 &&
         !p.tensor_parallel_mlp_only();
}

namespace {

void ParallelismError(const std::string& field, const std::string& what,
                      std::vector<std::string>* errors) {
  errors->push_back(absl::StrCat("spec.parallelism.", field, ": ", what));
}

// A group of tp x sp ranks (tensor-parallel groups inside sequence-parallel ones) must fit in a
// node: ranks fill nodes in order, so tp x sp must divide slots_per_node.
void CheckGroupsShareANode(const trainctl::v1::JobSpec& spec, int tp, int sp,
                           std::vector<std::string>* errors) {
  const int slots = spec.resources().slots_per_node();
  if (slots < 1 || slots % (tp * sp) == 0) return;
  if (tp > 1 && sp > 1) {
    ParallelismError(
        "tensor_parallel_size",
        absl::StrCat("tensor_parallel_size ", tp, " x sequence_parallel_size ", sp, " = ", tp * sp,
                     " does not divide resources.slots_per_node ", slots,
                     ": a tensor/sequence-parallel group's ranks must share a node"),
        errors);
    return;
  }
  const bool tensor = tp > 1;
  ParallelismError(
      tensor ? "tensor_parallel_size" : "sequence_parallel_size",
      absl::StrCat(tensor ? tp : sp, " does not divide resources.slots_per_node ", slots, ": a ",
                   tensor ? "tensor" : "sequence", "-parallel group's ranks must share a node"),
      errors);
}

// Both kinds of parallelism are built for SFT, logit distillation (a distill job with
// training.distill_loss; its teacher runs on the mesh too) and GRPO (its reference and reward
// models too); sequence parallelism not with packing yet.
void CheckParallelJobKind(const trainctl::v1::JobSpec& spec, int tp, int sp,
                          std::vector<std::string>* errors) {
  const bool logit_distill =
      spec.kind() == trainctl::v1::JOB_KIND_DISTILL && spec.training().has_distill_loss();
  const bool on_mesh = spec.kind() == trainctl::v1::JOB_KIND_SFT || logit_distill ||
                       spec.kind() == trainctl::v1::JOB_KIND_GRPO;
  if (!on_mesh) {
    const std::string what = absl::StrCat(
        "built for sft, logit distillation (distill with training.distill_loss) and grpo jobs "
        "only, this job is ",
        spec.kind() == trainctl::v1::JOB_KIND_PIPELINE  ? "a pipeline"
        : spec.kind() == trainctl::v1::JOB_KIND_DISTILL ? "trace distillation"
                                                        : trainctl::v1::JobKind_Name(spec.kind()));
    if (tp > 1) ParallelismError("tensor_parallel_size", what, errors);
    if (sp > 1) ParallelismError("sequence_parallel_size", what, errors);
  }
  if (sp > 1 && spec.training().packing()) {
    ParallelismError("sequence_parallel_size", "not with training.packing yet", errors);
  }
}

// When a model's config is known here: tp splits the MLP's width and (unless
// tensor_parallel_mlp_only) the attention and key/value heads, sp the heads a rank holds — of the
// trained model, and of a logit-distillation teacher or a GRPO reward model, which run on the
// same mesh (a reward model on whole sequences: a sequence-parallel group shares out its rows).
void CheckParallelModelShape(const trainctl::v1::JobSpec& spec, int tp, int sp,
                             std::vector<std::string>* errors) {
  const bool attention = TensorParallelSplitsAttention(spec);
  struct OnMesh {
    std::string whose, name;
    bool splits_sequences = true;
  };
  std::vector<OnMesh> models = {{"model", spec.model_name_or_path()}};
  if (spec.kind() == trainctl::v1::JOB_KIND_DISTILL && spec.training().has_distill_loss()) {
    models.push_back({"teacher", spec.teacher_model_name_or_path()});
  }
  if (spec.kind() == trainctl::v1::JOB_KIND_GRPO && !spec.reward_model_name_or_path().empty()) {
    models.push_back({"reward model", spec.reward_model_name_or_path(), false});
  }
  for (const auto& [whose, name, splits_sequences] : models) {
    auto shape = LookupModelShape(name);
    if (!shape.ok()) continue;
    const int64_t heads = HeadsPerTensorRank(shape->heads, tp, attention);
    const bool heads_split = heads != shape->heads;  // tp > 1 splits them
    if (attention && shape->heads % tp != 0) {
      ParallelismError("tensor_parallel_size",
                       absl::StrCat(tp, " does not divide the ", whose, "'s ", shape->heads,
                                    " attention heads (num_attention_heads, ", shape->source, ")",
                                    kTensorParallelMlpOnlyHint),
                       errors);
    }
    if (attention && shape->kv_heads % tp != 0) {
      ParallelismError("tensor_parallel_size",
                       absl::StrCat(tp, " does not divide the ", whose, "'s ", shape->kv_heads,
                                    " key/value heads (num_key_value_heads, ", shape->source, ")",
                                    kTensorParallelMlpOnlyHint),
                       errors);
    }
    if (splits_sequences && heads % sp != 0) {
      ParallelismError("sequence_parallel_size",
                       absl::StrCat(sp, " does not divide the ", whose, "'s ", shape->heads,
                                    " attention heads (num_attention_heads, ", shape->source, ")",
                                    heads_split ? absl::StrCat(" / tensor_parallel_size ", tp,
                                                               kTensorParallelMlpOnlyHint)
                                                : ""),
                       errors);
    }
    if (shape->intermediate % tp != 0) {
      ParallelismError("tensor_parallel_size",
                       absl::StrCat(tp, " does not divide the ", whose, "'s ", shape->intermediate,
                                    "-wide MLP (intermediate_size, ", shape->source, ")"),
                       errors);
    }
    if (spec.parallelism().vocab_parallel() && shape->vocab % tp != 0) {
      ParallelismError(
          "vocab_parallel",
          absl::StrCat("tensor_parallel_size ", tp, " does not divide the ", whose, "'s ",
                       shape->vocab, "-token vocabulary (vocab_size, ", shape->source, ")"),
          errors);
    }
  }
}

}  // namespace

void CheckParallelism(const trainctl::v1::JobSpec& spec, std::vector<std::string>* errors) {
  const auto& p = spec.parallelism();
  const int tp = p.has_tensor_parallel_size() ? p.tensor_parallel_size() : 1;
  const int sp = p.has_sequence_parallel_size() ? p.sequence_parallel_size() : 1;
  if (tp < 1)
    ParallelismError("tensor_parallel_size", absl::StrCat("must be >= 1, got ", tp), errors);
  if (sp < 1)
    ParallelismError("sequence_parallel_size", absl::StrCat("must be >= 1, got ", sp), errors);
  if (p.tensor_parallel_mlp_only() && tp <= 1) {
    ParallelismError("tensor_parallel_mlp_only",
                     absl::StrCat("says what the tensor-parallel group splits: needs "
                                  "tensor_parallel_size > 1, got ",
                                  tp),
                     errors);
  }
  if (p.vocab_parallel() && tp <= 1) {
    ParallelismError("vocab_parallel",
                     absl::StrCat("splits the vocabulary over the tensor-parallel group: needs "
                                  "tensor_parallel_size > 1, got ",
                                  tp),
                     errors);
  }
  if (tp < 1 || sp < 1 || (tp == 1 && sp == 1)) return;
  CheckGroupsShareANode(spec, tp, sp, errors);
  CheckParallelJobKind(spec, tp, sp, errors);
  CheckParallelModelShape(spec, tp, sp, errors);
}

}  // namespace trainctl
