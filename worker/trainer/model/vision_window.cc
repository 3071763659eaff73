#include "worker/trainer/model/vision_window.h"

#include <algorithm>

namespace trainctl::model {

VisionWindows GetWindowIndex(const Qwen2VLVisionConfig& config, const torch::Tensor& grid_thw) {
  TORCH_CHECK(grid_thw.defined() && grid_thw.dim() == 2 && grid_thw.size(1) == 3,
              "image_grid_thw must be [num_images, 3]");
  const int64_t merge = config.spatial_merge_size;
  const int64_t side = config.merged_window();
  TORCH_CHECK(merge > 0 && side > 0,
              "window attention needs a window of at least one merged "
              "patch (window_size ",
              config.window_size, ")");
  const int64_t unit = merge * merge;
  const torch::Tensor grid = grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const auto g = grid.accessor<int64_t, 2>();

  std::vector<int64_t> index;
  VisionWindows out;
  out.cu_seqlens.push_back(0);
  int64_t offset = 0;  // merged patches of the images before this one
  for (int64_t i = 0; i < grid.size(0); ++i) {
    const int64_t t = g[i][0], h = g[i][1] / merge, w = g[i][2] / merge;
    TORCH_CHECK(t > 0 && h > 0 && w > 0, "image ", i, ": grid (", g[i][0], ", ", g[i][1], ", ",
                g[i][2], ") holds no merged patch");
    for (int64_t frame = 0; frame < t; ++frame) {
      for (int64_t top = 0; top < h; top += side) {
        for (int64_t left = 0; left < w; left += side) {
          const int64_t bottom = std::min(top + side, h), right = std::min(left + side, w);
          for (int64_t r = top; r < bottom; ++r) {
            for (int64_t c = left; c < right; ++c) {
              index.push_back(offset + (frame * h + r) * w + c);
            }
          }
          out.cu_seqlens.push_back(out.cu_seqlens.back() + (bottom - top) * (right - left) * unit);
        }
      }
    }
    offset += t * h * w;
  }
  out.index = torch::tensor(index, torch::TensorOptions().dtype(torch::kInt64));
  out.inverse = torch::empty_like(out.index);
  out.inverse.index_put_({out.index}, torch::arange(offset, torch::kInt64));
  return out;
}

torch::Tensor ToWindowOrder(const torch::Tensor& x, const torch::Tensor& index,
                            int64_t merge_unit) {
  TORCH_CHECK(x.size(0) == index.size(0) * merge_unit, "window order: ", x.size(0), " rows for ",
              index.size(0), " merged patches of ", merge_unit);
  std::vector<int64_t> grouped = x.sizes().vec();
  grouped[0] = index.size(0);
  grouped.insert(grouped.begin() + 1, merge_unit);
  return x.reshape(grouped).index_select(0, index).reshape(x.sizes());
}

torch::Tensor FromWindowOrder(const torch::Tensor& x, const torch::Tensor& inverse) {
  return x.index_select(0, inverse);
}

}  // namespace trainctl::model
