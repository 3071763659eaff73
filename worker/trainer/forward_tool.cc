#include "worker/trainer/forward_tool.h"

#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/tool_request.h"

namespace trainctl::trainer {
namespace {

// Equally long rows as an int64 [rows, cols] tensor; `field` names them in the error.
absl::StatusOr<torch::Tensor> Matrix(const std::vector<std::vector<int64_t>>& rows,
                                     const char* field) {
  std::vector<int64_t> values;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].size() != rows[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request: ", field, ": row ", r, " has ", rows[r].size(), " tokens, row 0 has ",
          rows[0].size(),
          " (after expanding image pads); forward runs the batch as given: pad the rows to one "
          "length and mark the padding with attention_mask"));
    }
    values.insert(values.end(), rows[r].begin(), rows[r].end());
  }
  return torch::tensor(values, torch::kInt64)
      .view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

absl::Status RunForwardOrThrow(const std::string& model_dir, const std::string& request_path,
                               const std::string& out_path, const model::ForwardOptions& options) {
  ASSIGN_OR_RETURN(ToolRequest request, ReadToolRequest(request_path));
  ASSIGN_OR_RETURN(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                   model::LoadHfModel(model_dir, options.dtype));
  const model::Qwen2VLConfig& config = model->config();
  std::vector<std::vector<int64_t>> mask = std::move(request.attention_mask);
  ASSIGN_OR_RETURN(
      std::vector<std::vector<int64_t>> rows,
      ExpandImagePads(request.input_ids,
                      MergedImageTokens(request.image_grid_thw, config.vision.spatial_merge_size),
                      config.image_token_id, &mask));
  model::ModelInputs inputs;
  ASSIGN_OR_RETURN(inputs.input_ids, Matrix(rows, "input_ids"));
  if (!mask.empty()) {
    ASSIGN_OR_RETURN(inputs.attention_mask, Matrix(mask, "attention_mask"));
  }
  inputs.pixel_values = request.pixel_values;
  inputs.image_grid_thw = request.image_grid_thw;

  model->to(options.device);
  model->SetAttentionImpl(options.attention);
  model->eval();
  torch::NoGradGuard no_grad;
  ASSIGN_OR_RETURN(torch::Tensor logits, model::ForwardOrStatus(*model, inputs));
  return model::WriteSafetensors(out_path, {{"logits", logits.to(torch::kFloat32)}});
}

}  // namespace

absl::Status RunForward(const std::string& model_dir, const std::string& request_path,
                        const std::string& out_path, const model::ForwardOptions& options) {
  return model::Guarded(
      "", [&] { return RunForwardOrThrow(model_dir, request_path, out_path, options); },
      absl::StatusCode::kInvalidArgument);
}

}  // namespace trainctl::trainer
