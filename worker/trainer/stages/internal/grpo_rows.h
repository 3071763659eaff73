// GRPO's rows (one completion each) and the tensors built from them: prompts left-padded for
// generation, and prompt + completion for scoring and training, the layout
// model::CompletionLogProbs reads: a left-padded prompt block, then a right-padded completion
// block.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_GRPO_ROWS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_GRPO_ROWS_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/trainer/data/shard_reader.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::trainer::internal {

struct GrpoRow {
  int64_t sample = 0;                // dataset index
  std::vector<int64_t> prompt;       // tokens before the first trained one
  std::vector<float> pixel_values;   // the prompt's images' patches, [n, kPatchDim]
  std::vector<int64_t> grid;         // [images * 3]
  std::string solution;              // the record's
  bool prompt_cut_images = false;    // longer than max_prompt_length, kept whole for its images
  std::vector<int64_t> completion;   // sampled tokens, eos included when it stopped
  bool truncated = false;            // cut at max_completion_length
  std::string text;                  // the completion decoded, special tokens left out
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
  model::ModelInputs inputs;      // [b, P + C]
  int64_t completion_start = 0;   // P
  torch::Tensor completion_mask;  // [b, C] float32: 1 on completion tokens
  torch::Tensor advantages;       // [b] float32
};

// Rows [begin, end) as prompt + completion. With `mask_truncated`, truncated rows' completion
// masks are all zero (TRL's mask_truncated_completions).
TrainInputs MakeTrainInputs(const std::vector<GrpoRow>& rows, int64_t begin, int64_t end,
                            int64_t pad, bool mask_truncated, const torch::Device& device);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_GRPO_ROWS_H_
