#include "worker/trainer/stages/internal/grpo_rows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/data/batch.h"
#include "worker/trainer/model/generation.h"

namespace trainctl::trainer::internal {
namespace {

// The images of rows `order` (indices into `rows`), concatenated in that order.
void AddImages(const std::vector<GrpoRow>& rows, const std::vector<int64_t>& order,
               const torch::Device& device, model::ModelInputs* in) {
  std::vector<float> pixels;
  std::vector<int64_t> grid;
  for (const int64_t i : order) {
    const GrpoRow& row = rows[static_cast<size_t>(i)];
    pixels.insert(pixels.end(), row.pixel_values.begin(), row.pixel_values.end());
    grid.insert(grid.end(), row.grid.begin(), row.grid.end());
  }
  if (grid.empty()) return;
  const int64_t patches = static_cast<int64_t>(pixels.size()) / data::kPatchDim;
  in->pixel_values = torch::from_blob(pixels.data(), {patches, data::kPatchDim}, torch::kFloat32)
                         .to(device, /*non_blocking=*/false, /*copy=*/true);
  in->image_grid_thw = torch::tensor(grid, torch::kInt64).view({-1, 3});
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

// Where a packed row's rows lie: packed row `bin[i]`, from position `offset[i]`, for row
// begin + i; `order` lists the rows (indices into the rows vector) packed row by packed row.
struct Placement {
  std::vector<int64_t> bin, offset, order;
  std::vector<int64_t> used;  // tokens per packed row
};

// Greedy first fit, in order: each row goes into the first packed row with room for it whole.
Placement FirstFit(const std::vector<GrpoRow>& rows, int64_t begin, int64_t end, int64_t capacity) {
  Placement p;
  std::vector<std::vector<int64_t>> members;
  for (int64_t i = begin; i < end; ++i) {
    const GrpoRow& row = rows[static_cast<size_t>(i)];
    const int64_t len = static_cast<int64_t>(row.prompt.size() + row.completion.size());
    size_t b = 0;
    while (b < p.used.size() && p.used[b] + len > capacity) ++b;
    if (b == p.used.size()) {
      p.used.push_back(0);
      members.emplace_back();
    }
    p.bin.push_back(static_cast<int64_t>(b));
    p.offset.push_back(p.used[b]);
    p.used[b] += len;
    members[b].push_back(i);
  }
  for (const auto& m : members) p.order.insert(p.order.end(), m.begin(), m.end());
  return p;
}

}  // namespace

absl::StatusOr<GrpoRow> PromptRow(const data::ShardReader& reader, int64_t sample,
                                  int64_t max_prompt_length) {
  const data::SampleView view = reader.View(sample);
  int64_t end = 0;
  while (end < view.num_tokens && view.labels[end] == -100) ++end;
  if (end == 0 || end == view.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample ", sample, " of ", reader.dir(),
        ": no assistant turn marks where its prompt ends (grpo prompts are the tokens before the "
        "first trained one)"));
  }
  GrpoRow row;
  row.sample = sample;
  int64_t begin = 0;
  if (end > max_prompt_length) {
    if (view.num_images == 0) {
      begin = end - max_prompt_length;
    } else {
      row.prompt_cut_images = true;
    }
  }
  row.prompt.assign(view.input_ids + begin, view.input_ids + end);
  row.pixel_values.resize(static_cast<size_t>(view.num_patches * data::kPatchDim));
  if (view.num_patches > 0) view.CopyPatches(row.pixel_values.data());
  row.grid.assign(view.image_grid_thw, view.image_grid_thw + view.num_images * 3);
  row.solution = std::string(view.solution);
  return row;
}

model::ModelInputs PromptInputs(const std::vector<GrpoRow>& rows, int64_t pad,
                                const torch::Device& device) {
  int64_t width = 0;
  for (const GrpoRow& row : rows) width = std::max<int64_t>(width, row.prompt.size());
  const int64_t n = static_cast<int64_t>(rows.size());
  torch::Tensor ids = torch::full({n, width}, pad, torch::kInt64);
  torch::Tensor mask = torch::zeros({n, width}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t>& p = rows[static_cast<size_t>(i)].prompt;
    const int64_t len = static_cast<int64_t>(p.size());
    ids[i].slice(0, width - len).copy_(torch::tensor(p, torch::kInt64));
    mask[i].slice(0, width - len).fill_(1);
  }
  model::ModelInputs in;
  in.input_ids = ids.to(device);
  in.attention_mask = mask.to(device);
  AddImages(rows, Range(0, n), device, &in);
  return in;
}

TrainInputs MakeTrainInputs(const std::vector<GrpoRow>& rows, int64_t begin, int64_t end,
                            int64_t pad, bool mask_truncated, const torch::Device& device) {
  int64_t p_width = 0, c_width = 1;
  for (int64_t i = begin; i < end; ++i) {
    const GrpoRow& row = rows[static_cast<size_t>(i)];
    p_width = std::max<int64_t>(p_width, row.prompt.size());
    c_width = std::max<int64_t>(c_width, row.completion.size());
  }
  const int64_t n = end - begin;
  torch::Tensor ids = torch::full({n, p_width + c_width}, pad, torch::kInt64);
  torch::Tensor mask = torch::zeros({n, p_width + c_width}, torch::kInt64);
  torch::Tensor completion_mask = torch::zeros({n, c_width}, torch::kFloat32);
  torch::Tensor advantages = torch::zeros({n}, torch::kFloat32);
  for (int64_t i = 0; i < n; ++i) {
    const GrpoRow& row = rows[static_cast<size_t>(begin + i)];
    const int64_t p = static_cast<int64_t>(row.prompt.size());
    const int64_t c = static_cast<int64_t>(row.completion.size());
    ids[i].slice(0, p_width - p, p_width).copy_(torch::tensor(row.prompt, torch::kInt64));
    mask[i].slice(0, p_width - p, p_width).fill_(1);
    if (c > 0) {
      ids[i].slice(0, p_width, p_width + c).copy_(torch::tensor(row.completion, torch::kInt64));
      mask[i].slice(0, p_width, p_width + c).fill_(1);
      if (!(mask_truncated && row.truncated)) completion_mask[i].slice(0, 0, c).fill_(1);
    }
    advantages[i] = row.advantage;
  }
  TrainInputs out;
  out.inputs.input_ids = ids.to(device);
  out.inputs.attention_mask = mask.to(device);
  AddImages(rows, Range(begin, end), device, &out.inputs);
  out.completion_start = p_width;
  out.completion_mask = completion_mask.to(device);
  out.advantages = advantages.to(device);
  return out;
}

TrainInputs MakePackedTrainInputs(const std::vector<GrpoRow>& rows, int64_t begin, int64_t end,
                                  int64_t pad, bool mask_truncated, int64_t pack_length,
                                  const torch::Device& device) {
  int64_t longest = 0, c_width = 1;
  for (int64_t i = begin; i < end; ++i) {
    const GrpoRow& row = rows[static_cast<size_t>(i)];
    longest = std::max<int64_t>(longest, row.prompt.size() + row.completion.size());
    c_width = std::max<int64_t>(c_width, row.completion.size());
  }
  const Placement place = FirstFit(rows, begin, end, std::max(pack_length, longest));
  const int64_t bins = static_cast<int64_t>(place.used.size());
  const int64_t width =
      place.used.empty() ? 1 : *std::max_element(place.used.begin(), place.used.end());
  const int64_t n = end - begin;
  torch::Tensor ids = torch::full({bins, width}, pad, torch::kInt64);
  torch::Tensor mask = torch::zeros({bins, width}, torch::kInt64);
  torch::Tensor segments = torch::zeros({bins, width}, torch::kInt64);
  torch::Tensor completion_mask = torch::zeros({n, c_width}, torch::kFloat32);
  torch::Tensor advantages = torch::zeros({n}, torch::kFloat32);
  torch::Tensor predictors = torch::zeros({n, c_width}, torch::kInt64);
  torch::Tensor targets = torch::zeros({n, c_width}, torch::kInt64);
  std::vector<int64_t> samples_in(static_cast<size_t>(bins), 0);
  auto* id = ids.data_ptr<int64_t>();
  auto* m = mask.data_ptr<int64_t>();
  auto* seg = segments.data_ptr<int64_t>();
  auto* pred = predictors.data_ptr<int64_t>();
  auto* tgt = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const GrpoRow& row = rows[static_cast<size_t>(begin + i)];
    const int64_t p = static_cast<int64_t>(row.prompt.size());
    const int64_t c = static_cast<int64_t>(row.completion.size());
    const int64_t bin = place.bin[static_cast<size_t>(i)];
    const int64_t at = bin * width + place.offset[static_cast<size_t>(i)];
    const int64_t segment = ++samples_in[static_cast<size_t>(bin)];
    std::copy(row.prompt.begin(), row.prompt.end(), id + at);
    std::copy(row.completion.begin(), row.completion.end(), id + at + p);
    std::fill(m + at, m + at + p + c, 1);
    std::fill(seg + at, seg + at + p + c, segment);
    // Position at + p - 1 + j predicts completion token j; past the completion, token 0's.
    for (int64_t j = 0; j < c_width; ++j) {
      const int64_t k = j < c ? j : 0;
      pred[i * c_width + j] = at + p - 1 + k;
      tgt[i * c_width + j] = c > 0 ? row.completion[static_cast<size_t>(k)] : pad;
    }
    if (c > 0 && !(mask_truncated && row.truncated)) completion_mask[i].slice(0, 0, c).fill_(1);
    advantages[i] = row.advantage;
  }
  TrainInputs out;
  out.inputs.input_ids = ids;
  out.inputs.attention_mask = mask;
  out.inputs.segment_ids = segments;
  AddImages(rows, place.order, device, &out.inputs);
  out.completion_mask = completion_mask.to(device);
  out.advantages = advantages.to(device);
  out.predictors = predictors.to(device);
  out.targets = targets.to(device);
  return out;
}

torch::Tensor TrainLogProbs(model::Qwen2VLForConditionalGeneration& model, const TrainInputs& in) {
  if (in.packed()) {
    return model::PackedCompletionLogProbs(model, in.inputs, in.predictors, in.targets);
  }
  return model::CompletionLogProbs(model, in.inputs, in.completion_start);
}

}  // namespace trainctl::trainer::internal
