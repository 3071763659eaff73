// The device mesh of a job (JobSpec.parallelism): world = data x sequence x tensor parallel
// ranks. Ranks are laid out sequence-parallel innermost: global rank r is in sequence-parallel
// group r / sp at position r % sp, and in data-parallel group r % sp at position r / sp, so a
// group of sp consecutive ranks shares one node when slots_per_node is a multiple of sp (ranks
// fill nodes in order). ZeRO shards over every rank (data x sequence: the sequence-parallel ranks
// hold the same weights and their gradients add up, as DeepSpeed-Ulysses does).
#ifndef TRAINCTL_COMMON_PARALLELISM_SPEC_H_
#define TRAINCTL_COMMON_PARALLELISM_SPEC_H_

#include <string>
#include <vector>

#include "trainctl/v1/job.pb.h"

namespace trainctl {

struct DeviceMesh {
  int data = 1, sequence = 1, tensor = 1;

  int world() const { return data * sequence * tensor; }
  // This rank's sequence-parallel group (consecutive ranks) and its position in it.
  std::vector<int> SequenceGroup(int rank) const;
  int SequenceRank(int rank) const { return rank % sequence; }
  // The data-parallel index: which batch of the step this rank's group reads.
  int DataRank(int rank) const { return rank / sequence; }
};

// The spec's mesh over `world` ranks (sizes default to 1); unchecked: CheckParallelism first.
DeviceMesh MeshOf(const trainctl::v1::JobSpec& spec, int world);

// Appends "spec.parallelism.<field>: <what>" errors: sizes below 1, tensor parallelism (not built
// yet), a sequence-parallel size that does not divide slots_per_node (its groups must stay inside
// a node), a kind other than sft, packing, and, when the model's config is known here
// (common/model_catalog.h), attention heads it does not divide — each naming the numbers.
void CheckParallelism(const trainctl::v1::JobSpec& spec, std::vector<std::string>* errors);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_PARALLELISM_SPEC_H_
