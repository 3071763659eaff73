#include "common/parallelism_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model_catalog.h"

namespace trainctl {

std::vector<int> DeviceMesh::SequenceGroup(int rank) const {
  std::vector<int> group;
  const int first = rank - rank % sequence;
  for (int i = 0; i < sequence; ++i) group.push_back(first + i);
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

void CheckParallelism(const trainctl::v1::JobSpec& spec, std::vector<std::string>* errors) {
  const auto& p = spec.parallelism();
  const std::string path = "spec.parallelism.";
  auto fail = [&](const std::string& field, const std::string& what) {
    errors->push_back(absl::StrCat(path, field, ": ", what));
  };
  if (p.has_tensor_parallel_size() && p.tensor_parallel_size() < 1) {
    fail("tensor_parallel_size", absl::StrCat("must be >= 1, got ", p.tensor_parallel_size()));
  }
  if (p.tensor_parallel_size() > 1) {
    fail("tensor_parallel_size",
         absl::StrCat("tensor parallelism is not built yet (got ", p.tensor_parallel_size(),
                      "); sequence_parallel_size splits long sequences across ranks"));
  }
  if (!p.has_sequence_parallel_size()) return;
  const int sp = p.sequence_parallel_size();
  if (sp < 1) return fail("sequence_parallel_size", absl::StrCat("must be >= 1, got ", sp));
  if (sp == 1) return;
  const int slots = spec.resources().slots_per_node();
  if (slots >= 1 && slots % sp != 0) {
    fail("sequence_parallel_size",
         absl::StrCat(sp, " does not divide resources.slots_per_node ", slots,
                      ": a sequence-parallel group's ranks must share a node"));
  }
  if (spec.kind() != trainctl::v1::JOB_KIND_SFT) {
    fail("sequence_parallel_size", absl::StrCat("built for sft jobs only, this job is ",
                                                spec.kind() == trainctl::v1::JOB_KIND_PIPELINE
                                                    ? "a pipeline"
                                                    : trainctl::v1::JobKind_Name(spec.kind())));
  }
  if (spec.training().packing()) {
    fail("sequence_parallel_size", "not with training.packing yet");
  }
  auto shape = LookupModelShape(spec.model_name_or_path());
  if (shape.ok() && shape->heads % sp != 0) {
    fail("sequence_parallel_size",
         absl::StrCat(sp, " does not divide the model's ", shape->heads,
                      " attention heads (num_attention_heads, ", shape->source, ")"));
  }
}

}  // namespace trainctl
