#include "worker/trainer/model/forward_tool.h"

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::model {
namespace {

using nlohmann::json;

// A rectangular [rows][cols] array of integers as an int64 tensor.
absl::StatusOr<torch::Tensor> IntMatrix(const json& request, const std::string& field) {
  const json& rows = request[field];
  auto bad = [&field](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", field, ": ", what));
  };
  if (!rows.is_array() || rows.empty()) return bad("expected a non-empty array of arrays");
  std::vector<int64_t> values;
  int64_t cols = -1;
  for (size_t r = 0; r < rows.size(); ++r) {
    const json& row = rows[r];
    if (!row.is_array() || row.empty()) {
      return bad(absl::StrCat("row ", r, " is not a non-empty array"));
    }
    if (cols >= 0 && static_cast<int64_t>(row.size()) != cols) {
      return bad(absl::StrCat("row ", r, " has ", row.size(), " entries, row 0 has ", cols));
    }
    cols = static_cast<int64_t>(row.size());
    for (const json& v : row) {
      if (!v.is_number_integer()) return bad(absl::StrCat("row ", r, " holds ", v.dump()));
      values.push_back(v.get<int64_t>());
    }
  }
  return torch::tensor(values, torch::kInt64).view({static_cast<int64_t>(rows.size()), cols});
}

absl::StatusOr<ModelInputs> ParseRequest(const std::string& request_json) {
  const json request = json::parse(request_json, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return absl::InvalidArgumentError("request: not a JSON object");
  }
  if (!request.contains("input_ids")) {
    return absl::InvalidArgumentError("request: input_ids: required field is missing");
  }
  ModelInputs inputs;
  ASSIGN_OR_RETURN(inputs.input_ids, IntMatrix(request, "input_ids"));
  if (request.contains("attention_mask") && !request["attention_mask"].is_null()) {
    ASSIGN_OR_RETURN(inputs.attention_mask, IntMatrix(request, "attention_mask"));
    if (inputs.attention_mask.sizes() != inputs.input_ids.sizes()) {
      return absl::InvalidArgumentError("request: attention_mask: shape differs from input_ids");
    }
  }
  if (request.contains("pixel_values_file") && !request["pixel_values_file"].is_null()) {
    if (!request["pixel_values_file"].is_string()) {
      return absl::InvalidArgumentError("request: pixel_values_file: expected a path");
    }
    const std::string file = request["pixel_values_file"].get<std::string>();
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> images, SafetensorsFile::Open(file));
    ASSIGN_OR_RETURN(inputs.pixel_values, images->Get("pixel_values", torch::kFloat32));
    ASSIGN_OR_RETURN(inputs.image_grid_thw, images->Get("image_grid_thw", torch::kInt64));
  }
  return inputs;
}

}  // namespace

absl::StatusOr<ForwardOptions> ParseForwardOptions(const std::string& device,
                                                   const std::string& dtype,
                                                   const std::string& attention) {
  ForwardOptions options;
  if (!device.empty()) {
    try {
      options.device = torch::Device(device);
    } catch (const c10::Error&) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: expected cpu or cuda[:N], got '", device, "'"));
    }
    if (options.device.is_cuda() && !torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device ", device, ": this machine or build has no CUDA device"));
    }
  }
  if (dtype == "bfloat16" || dtype == "bf16") {
    options.dtype = torch::kBFloat16;
  } else if (!dtype.empty() && dtype != "float32" && dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: expected float32 or bfloat16, got '", dtype, "'"));
  }
  if (!attention.empty()) {
    auto impl = ParseAttentionImpl(attention);
    if (!impl.ok()) return impl.status();
    options.attention = *impl;
  }
  return options;
}

absl::Status RunForward(const std::string& model_dir, const std::string& request_json,
                        const std::string& out_path, const ForwardOptions& options) {
  ASSIGN_OR_RETURN(ModelInputs inputs, ParseRequest(request_json));
  ASSIGN_OR_RETURN(std::shared_ptr<Qwen2VLForConditionalGeneration> model,
                   LoadHfModel(model_dir, options.dtype));
  model->to(options.device);
  model->SetAttentionImpl(options.attention);
  model->eval();
  torch::NoGradGuard no_grad;
  ASSIGN_OR_RETURN(torch::Tensor logits, ForwardOrStatus(*model, inputs));
  return WriteSafetensors(out_path, {{"logits", logits.to(torch::kFloat32)}});
}

}  // namespace trainctl::model
