// Shared by the Qwen2.5-VL tests: HF's window index written independently of the model's.
#ifndef TRAINCTL_TESTS_MODEL_QWEN25VL_TEST_UTIL_H_
#define TRAINCTL_TESTS_MODEL_QWEN25VL_TEST_UTIL_H_

#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace trainctl::model::testing {

struct ReferenceWindows {
  torch::Tensor index;
  std::vector<int64_t> cu_seqlens;
};

// HF's get_window_index as transformers writes it, with tensor ops: each frame's merged-patch
// indices padded with -100 up to whole windows (a full window more where the side divides),
// cut into windows, the padding dropped; cu_window_seqlens then unique_consecutive.
inline ReferenceWindows HfWindowIndex(const std::vector<std::vector<int64_t>>& grids, int64_t merge,
                                      int64_t patch, int64_t window_size) {
  const int64_t side = window_size / merge / patch;
  std::vector<torch::Tensor> parts;
  std::vector<int64_t> cu = {0};
  int64_t id = 0;
  for (const std::vector<int64_t>& g : grids) {
    const int64_t t = g[0], h = g[1] / merge, w = g[2] / merge;
    const torch::Tensor index = torch::arange(t * h * w).reshape({t, h, w});
    const int64_t pad_h = side - h % side, pad_w = side - w % side;
    const int64_t nh = (h + pad_h) / side, nw = (w + pad_w) / side;
    torch::Tensor padded = torch::constant_pad_nd(index, {0, pad_w, 0, pad_h}, -100);
    padded = padded.reshape({t, nh, side, nw, side}).permute({0, 1, 3, 2, 4});
    padded = padded.reshape({t, nh * nw, side, side});
    const torch::Tensor seqlens = padded.ne(-100).sum({2, 3}).reshape(-1);
    const torch::Tensor flat = padded.reshape(-1);
    parts.push_back(flat.masked_select(flat.ne(-100)) + id);
    const torch::Tensor ends = seqlens.cumsum(0) * merge * merge + cu.back();
    for (int64_t k = 0; k < ends.size(0); ++k) cu.push_back(ends[k].item<int64_t>());
    id += t * h * w;
  }
  const torch::Tensor unique = std::get<0>(torch::unique_consecutive(torch::tensor(cu)));
  return {torch::cat(parts), std::vector<int64_t>(unique.data_ptr<int64_t>(),
                                                  unique.data_ptr<int64_t>() + unique.numel())};
}

}  // namespace trainctl::model::testing

#endif  // TRAINCTL_TESTS_MODEL_QWEN25VL_TEST_UTIL_H_
