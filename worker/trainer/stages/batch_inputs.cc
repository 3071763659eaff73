#include "worker/trainer/stages/batch_inputs.h"

#include <algorithm>

namespace trainctl::trainer {

model::ModelInputs ToModelInputs(const data::Batch& b, const torch::Device& device) {
  auto i32 = [&](const std::vector<int32_t>& v, std::vector<int64_t> shape) {
    return torch::from_blob(const_cast<int32_t*>(v.data()), shape, torch::kInt32)
        .to(device, torch::kInt64);
  };
  model::ModelInputs in;
  in.input_ids = i32(b.input_ids, {b.batch_size, b.seq_len});
  in.attention_mask = i32(b.attention_mask, {b.batch_size, b.seq_len});
  // A packed batch (some row holds several samples) carries its segments: the model keeps the
  // samples apart and restarts their positions.
  if (std::any_of(b.segment_ids.begin(), b.segment_ids.end(), [](int32_t s) { return s > 1; })) {
    in.segment_ids = i32(b.segment_ids, {b.batch_size, b.seq_len});
  }
  if (!b.image_grid_thw.empty()) {
    const int64_t patches = static_cast<int64_t>(b.pixel_values.size()) / data::kPatchDim;
    in.pixel_values = torch::from_blob(const_cast<float*>(b.pixel_values.data()),
                                       {patches, data::kPatchDim}, torch::kFloat32)
                          .to(device, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
    in.image_grid_thw =
        i32(b.image_grid_thw, {static_cast<int64_t>(b.image_grid_thw.size()) / 3, 3});
  }
  return in;
}

torch::Tensor ShiftedLabels(const data::Batch& b, const torch::Device& device) {
  auto labels = torch::from_blob(const_cast<int32_t*>(b.labels.data()), {b.batch_size, b.seq_len},
                                 torch::kInt32)
                    .to(device, torch::kInt64);
  return labels.slice(1, 1, b.seq_len);
}

}  // namespace trainctl::trainer
