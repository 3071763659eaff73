#include "worker/trainer/stages/batch_inputs.h"

#include <algorithm>

namespace trainctl::trainer {

model::ModelInputs ToModelInputs(const data::Batch& b, const torch::Device& device) {
  // The integer tensors stay on the host: the model reads them there (positions, padding,
  // packing, image tokens) without a device synchronisation and copies the ids over itself.
  auto i32 = [&](const std::vector<int32_t>& v, std::vector<int64_t> shape) {
    return torch::from_blob(const_cast<int32_t*>(v.data()), shape, torch::kInt32).to(torch::kInt64);
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
    const torch::Tensor pixels = torch::from_blob(const_cast<float*>(b.pixel_values.data()),
                                                  {patches, data::kPatchDim}, torch::kFloat32);
    in.pixel_values = device.is_cpu() ? pixels.clone() : model::ToDeviceAsync(pixels, device);
    in.image_grid_thw =
        i32(b.image_grid_thw, {static_cast<int64_t>(b.image_grid_thw.size()) / 3, 3});
  }
  return in;
}

torch::Tensor ShiftedLabels(const data::Batch& b, const torch::Device& device) {
  auto labels = model::ToDeviceAsync(torch::from_blob(const_cast<int32_t*>(b.labels.data()),
                                                      {b.batch_size, b.seq_len}, torch::kInt32)
                                         .to(torch::kInt64),
                                     device);
  return labels.slice(1, 1, b.seq_len);
}

}  // namespace trainctl::trainer
