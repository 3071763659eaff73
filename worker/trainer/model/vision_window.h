// Qwen2.5-VL's window attention in the vision tower: the order HF's get_window_index puts the
// patches in, so that each window of merged patches is one contiguous run the blocks attend within,
// and the way back after the merger.
//
// A window is window_size / spatial_merge_size / patch_size merged patches a side
// (merged_window()), laid over each frame of each image from its top-left corner; windows at the
// right and bottom edges are cut short (HF pads them with -100 and drops the padding). Patches move
// in units of one merged patch (spatial_merge_size^2 consecutive patches), so the merger still sees
// its groups.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_VISION_WINDOW_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_VISION_WINDOW_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "worker/trainer/model/qwen2vl_config.h"

namespace trainctl::model {

struct VisionWindows {
  // [M] int64 on the CPU, M = merged patches of all images: index[i] is the merged patch (in the
  // processor's order) at window-order position i. HF's window_index.
  torch::Tensor index;
  // [M] int64 on the CPU: argsort(index), the window-order position of each merged patch.
  torch::Tensor inverse;
  // Window k owns window-order patches [cu_seqlens[k], cu_seqlens[k + 1]) (in patches, not merged
  // patches), empty windows left out: HF's cu_window_seqlens after unique_consecutive.
  std::vector<int64_t> cu_seqlens;
};

// The windows of the images `grid_thw` ([n, 3] (t, h, w) in patches; h and w multiples of
// spatial_merge_size, which the caller has checked) under `config` (a Qwen2.5-VL vision config,
// merged_window() > 0). Throws c10::Error on a malformed grid.
VisionWindows GetWindowIndex(const Qwen2VLVisionConfig& config, const torch::Tensor& grid_thw);

// Rows of `x` ([N, ...], N = M * merge_unit, in the processor's order) reordered into window
// order: merged patch index[i]'s merge_unit rows become rows [i * merge_unit, (i + 1) *
// merge_unit). `index` on x's device. Differentiable.
torch::Tensor ToWindowOrder(const torch::Tensor& x, const torch::Tensor& index, int64_t merge_unit);

// The merger's output [M, D] in window order back in the processor's order (rows taken by
// `inverse`, on x's device). Differentiable.
torch::Tensor FromWindowOrder(const torch::Tensor& x, const torch::Tensor& inverse);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_VISION_WINDOW_H_
