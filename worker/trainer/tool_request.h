// The request file `trainctl-trainer forward` and `trainctl-trainer generate` both read:
//   {"input_ids": [[...], ...]          token ids per row,
//    "attention_mask"?: [[...], ...]    0/1 per token, each row as long as its input_ids row,
//    "images"?: ["a.png", ...]          files relative to the request's folder, run through the
//                                       data pipeline's image processor (data/image_processor.h),
//    "pixel_values_file"?: "x.safetensors"   or pixel_values [N, 1176] + image_grid_thw [n, 3]
//                                       already processed (relative: to the working directory)}
// Images are matched in order, across rows, to the <|image_pad|> runs of input_ids. A run is
// either already as long as the image's merged patch count, or a single <|image_pad|>, which is
// expanded to that count (as `trainctl prepare` does), so a request may hold one pad per image.
#ifndef TRAINCTL_WORKER_TRAINER_TOOL_REQUEST_H_
#define TRAINCTL_WORKER_TRAINER_TOOL_REQUEST_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainctl::trainer {

struct ToolRequest {
  std::vector<std::vector<int64_t>> input_ids;  // as given; rows may differ in length
  std::vector<std::vector<int64_t>>
      attention_mask;            // empty when absent; else 0/1, input_ids' shape
  torch::Tensor pixel_values;    // [patches, 1176] float32; undefined: no images
  torch::Tensor image_grid_thw;  // [images, 3] int64
};

// Reads and checks the request file at `path`. NOT_FOUND when it (or an image) cannot be read;
// INVALID_ARGUMENT naming the field otherwise; inline JSON given for the path is INVALID_ARGUMENT
// saying the request is a file.
absl::StatusOr<ToolRequest> ReadToolRequest(const std::string& path);

// Each image's count of <|image_pad|> tokens: t * h * w / merge^2 of its grid row.
std::vector<int64_t> MergedImageTokens(const torch::Tensor& image_grid_thw,
                                       int64_t spatial_merge_size);

// Expands image pads in `rows` (see the file comment): `merged_tokens[i]` is image i's count of
// <|image_pad|> tokens. With a non-null, non-empty `mask` (as `rows`' shape) its entries are
// expanded alongside, an expanded pad's repeated. INVALID_ARGUMENT when a run matches neither 1
// nor the count, or runs and images differ in number.
absl::StatusOr<std::vector<std::vector<int64_t>>> ExpandImagePads(
    const std::vector<std::vector<int64_t>>& rows, const std::vector<int64_t>& merged_tokens,
    int64_t image_pad_id, std::vector<std::vector<int64_t>>* mask = nullptr);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_TOOL_REQUEST_H_
