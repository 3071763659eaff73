// The device mesh of a job (JobSpec.parallelism): world = data x sequence x tensor parallel
// ranks. Tensor parallel is innermost, then sequence parallel: global rank
//   r = (d * sequence + s) * tensor + t
// for data index d, sequence position s and tensor position t. A tensor-parallel group is
// `tensor` consecutive ranks, a sequence-parallel group `sequence` ranks `tensor` apart, so both
// stay inside a node when slots_per_node is a multiple of sequence x tensor (ranks fill nodes in
// order, and the scheduler needs no change).
//
// ZeRO shards over the ranks that hold the same weights: every rank with the same tensor
// position t (data x sequence of them). A sequence-parallel group's ranks hold the same weights
// and their gradients add up, as DeepSpeed-Ulysses does; a tensor-parallel group's ranks hold
// different slices of each MLP and the same replicated weights, whose gradients are equal on
// each of them (model/tensor_parallel.h).
#ifndef TRAINCTL_COMMON_PARALLELISM_SPEC_H_
#define TRAINCTL_COMMON_PARALLELISM_SPEC_H_

#include <string>
#include <vector>

#include "trainctl/v1/job.pb.h"

namespace trainctl {

struct DeviceMesh {
  int data = 1, sequence = 1, tensor = 1;

  int world() const { return data * sequence * tensor; }
  // This rank's sequence-parallel group (world ranks in group order) and its position in it.
  std::vector<int> SequenceGroup(int rank) const;
  int SequenceRank(int rank) const { return (rank / tensor) % sequence; }
  // This rank's tensor-parallel group (consecutive ranks) and its position in it.
  std::vector<int> TensorGroup(int rank) const;
  int TensorRank(int rank) const { return rank % tensor; }
  // The ranks ZeRO shards this rank's weights over: those with its tensor position.
  std::vector<int> ZeroGroup(int rank) const;
  // The data-parallel index: which batch of the step this rank's groups read.
  int DataRank(int rank) const { return rank / (sequence * tensor); }
};

// The spec's mesh over `world` ranks (sizes default to 1); unchecked: CheckParallelism first.
DeviceMesh MeshOf(const trainctl::v1::JobSpec& spec, int world);

// Whether tensor parallelism splits the decoder's attention heads too (tensor_parallel_size > 1
// without tensor_parallel_mlp_only).
bool TensorParallelSplitsAttention(const trainctl::v1::JobSpec& spec);

// The attention heads of `heads` a rank holds, the ones sequence parallelism splits further: its
// tensor-parallel share when `attention_split` and `tp` divides them, else all of them (a `tp`
// that does not divide them is refused on its own account).
inline int64_t HeadsPerTensorRank(int64_t heads, int64_t tp, bool attention_split) {
  return attention_split && heads % tp == 0 ? heads / tp : heads;
}

// What a refusal caused by split attention heads appends: the key that keeps attention whole.
inline constexpr char kTensorParallelMlpOnlyHint[] =
    "; parallelism.tensor_parallel_mlp_only: true splits only the MLPs";

// Appends "spec.parallelism.<field>: <what>" errors, each naming the numbers: sizes below 1,
// sequence x tensor not dividing slots_per_node (the groups must stay inside a node), a kind
// other than sft, packing with sequence parallelism, and, when the model's config is known here
// (common/model_catalog.h), attention heads (a tensor-parallel rank's share of them when it
// splits attention) the sequence-parallel size does not divide, or an MLP width
// (intermediate_size), attention or key/value heads (unless tensor_parallel_mlp_only) or, with
// vocab_parallel, a vocabulary the tensor-parallel size does not divide; vocab_parallel or
// tensor_parallel_mlp_only without tensor parallelism.
void CheckParallelism(const trainctl::v1::JobSpec& spec, std::vector<std::string>* errors);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_PARALLELISM_SPEC_H_
