// The unit the data pipeline hands the trainer: plain arrays, no LibTorch, so `trainctl prepare`
// and the loader stay light. The trainer wraps them as tensors without copying (torch::from_blob).
#ifndef TRAINCTL_COMMON_DATA_BATCH_H_
#define TRAINCTL_COMMON_DATA_BATCH_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace trainctl::data {

// Width of one flattened patch: channels 3 x temporal_patch_size 2 x patch_size 14 x 14.
inline constexpr int64_t kPatchDim = 3 * 2 * 14 * 14;  // 1176

// One prepared training example.
struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;      // same length; -100 where not trained on
  std::vector<float> pixel_values;  // [num_patches, kPatchDim], images in order of appearance
  std::vector<std::array<int32_t, 3>> image_grid_thw;  // one (t, h, w) in patches per image
  // The reference answer rewards compare a completion with (UTF-8): the record's "solution" field,
  // else its last assistant turn's text. Empty when unknown (shards of format version 1).
  std::string solution;
};

// Samples padded to one length (or packed into rows of one length). Row-major, batch-major.
struct Batch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> input_ids;       // [batch_size * seq_len], padded with the pad token
  std::vector<int32_t> labels;          // [batch_size * seq_len], -100 on padding
  std::vector<int32_t> attention_mask;  // [batch_size * seq_len], 1 for tokens, 0 for padding
  // [batch_size * seq_len]: which sample of its row a token belongs to, 1, 2, ... in order, 0 on
  // padding. Padded batches hold one sample per row (all 1s); packed rows hold several, which must
  // not attend to each other and whose positions (1-D and M-RoPE) restart at each segment.
  std::vector<int32_t> segment_ids;
  std::vector<float> pixel_values;      // [total_patches, kPatchDim], images in row-major order
  std::vector<int32_t> image_grid_thw;  // [num_images * 3]
  int64_t num_label_tokens = 0;         // labels != -100, for the loss normalisation
  // One per sample, in the order the samples appear (row-major; a packed row holds several).
  std::vector<std::string> solutions;
};

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_BATCH_H_
