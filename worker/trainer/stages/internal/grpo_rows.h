// GRPO's rows (one completion each) and the tensors built from them: prompts left-padded for
// generation, and prompt + completion for scoring and training, either in the layout
// model::CompletionLogProbs reads (a left-padded prompt block, then a right-padded completion
// block) or, with training.packing, packed padding-free for model::PackedCompletionLogProbs.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_GRPO_ROWS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_GRPO_ROWS_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/shard_reader.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::trainer::internal {

struct GrpoRow {
  int64_t sample = 0;               // dataset index
  std::vector<int64_t> prompt;      // tokens before the first trained one
  std::vector<float> pixel_values;  // the prompt's images' patches, [n, kPatchDim]
  std::vector<int64_t> grid;        // [images * 3]
  std::string solution;             // the record's
  bool prompt_cut_images = false;   // longer than max_prompt_length, kept whole for its images
  std::vector<int64_t> completion;  // sampled tokens, eos included when it stopped
  bool truncated = false;           // cut at max_completion_length
  std::string text;                 // the completion decoded, special tokens left out
  double advantage = 0;
};

// Row of sample `sample`: its prompt (text-only prompts keep their last max_prompt_length
// tokens, as TRL truncates from the left), images and solution. INVALID_ARGUMENT naming the
// sample when it has no trained token (nothing marks where its prompt ends).
absl::StatusOr<GrpoRow> PromptRow(const data::ShardReader& reader, int64_t sample,
                                  int64_t max_prompt_length);

// The rows' prompts left-padded with `pad`, with their images, on `device`.
model::ModelInputs PromptInputs(const std::vector<GrpoRow>& rows, int64_t pad,
                                const torch::Device& device);

struct TrainInputs {
  model::ModelInputs inputs;      // [b, P + C]; packed: [R, T] with segment_ids
  int64_t completion_start = 0;   // P; 0 when packed
  torch::Tensor completion_mask;  // [b, C] float32: 1 on completion tokens
  torch::Tensor advantages;       // [b] float32
  // Packed only (undefined otherwise), [b, C] int64: for completion token j of row i, the flat
  // index (packed row * T + position) of the position that predicts it, and the token. Past a
  // row's completion both repeat its first entry (finite, masked by completion_mask).
  torch::Tensor predictors;
  torch::Tensor targets;

  bool packed() const { return predictors.defined(); }
};

// Rows [begin, end) as prompt + completion. With `mask_truncated`, truncated rows' completion
// masks are all zero (TRL's mask_truncated_completions).
TrainInputs MakeTrainInputs(const std::vector<GrpoRow>& rows, int64_t begin, int64_t end,
                            int64_t pad, bool mask_truncated, const torch::Device& device);

// MakeTrainInputs packed padding-free (training.packing): each row, its prompt with its images
// then its completion, goes whole into the first packed row it fits in, in order, a packed row
// holding at most max(pack_length, longest row) tokens; segment ids keep the rows apart (their
// positions restart, attention stays inside each). completion_mask and advantages are
// MakeTrainInputs's, [b, C]. The images follow the packed order. input_ids, attention_mask and
// segment_ids stay on the host (the model reads them there without a device synchronisation).
TrainInputs MakePackedTrainInputs(const std::vector<GrpoRow>& rows, int64_t begin, int64_t end,
                                  int64_t pad, bool mask_truncated, int64_t pack_length,
                                  const torch::Device& device);

// Per-completion-token log-probabilities [b, C] float32 of `in` under `model`, packed or not
// (model::PackedCompletionLogProbs or model::CompletionLogProbs), with the caller's grad mode.
torch::Tensor TrainLogProbs(model::Qwen2VLForConditionalGeneration& model, const TrainInputs& in);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_GRPO_ROWS_H_
