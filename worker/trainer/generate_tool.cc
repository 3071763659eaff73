#include "worker/trainer/generate_tool.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/data/image_processor.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::trainer {
namespace {

using nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// An id or a list of ids at `key` of the JSON object in `path`; empty when absent or malformed.
std::vector<int64_t> IdsAt(const std::string& path, const char* key) {
  auto text = ReadFile(path);
  if (!text.ok()) return {};
  const json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains(key)) return {};
  std::vector<int64_t> out;
  const json& value = doc[key];
  if (value.is_number_integer()) {
    out.push_back(value.get<int64_t>());
  } else if (value.is_array()) {
    for (const json& v : value) {
      if (!v.is_number_integer()) return {};
      out.push_back(v.get<int64_t>());
    }
  }
  return out;
}

// Rows of integers, possibly ragged.
absl::StatusOr<std::vector<std::vector<int64_t>>> IntRows(const json& request,
                                                          const std::string& field) {
  const json& rows = request[field];
  auto bad = [&field](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", field, ": ", what));
  };
  if (!rows.is_array() || rows.empty()) return bad("expected a non-empty array of arrays");
  std::vector<std::vector<int64_t>> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    const json& row = rows[r];
    if (!row.is_array() || row.empty()) {
      return bad(absl::StrCat("row ", r, " is not a non-empty array"));
    }
    out.emplace_back();
    for (const json& v : row) {
      if (!v.is_number_integer()) return bad(absl::StrCat("row ", r, " holds ", v.dump()));
      out.back().push_back(v.get<int64_t>());
    }
  }
  return out;
}

struct Request {
  std::vector<std::vector<int64_t>> rows;  // real tokens only, pads not yet expanded
  torch::Tensor pixel_values;
  torch::Tensor image_grid_thw;
};

absl::Status LoadImages(const json& images, const std::filesystem::path& folder, Request& out) {
  if (!images.is_array()) return absl::InvalidArgumentError("request: images: expected an array");
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!images[i].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("request: images[", i, "]: expected a path"));
    }
    const std::filesystem::path file = folder / images[i].get<std::string>();
    ASSIGN_OR_RETURN(data::RgbImage image, data::ReadImageFile(file.string()));
    ASSIGN_OR_RETURN(data::ProcessedImage processed, data::PreprocessImage(image));
    const int64_t patches = processed.num_patches();
    pixels.push_back(
        torch::from_blob(processed.pixel_values.data(),
                         {patches, static_cast<int64_t>(processed.pixel_values.size()) /
                                       std::max<int64_t>(patches, 1)},
                         torch::kFloat32)
            .clone());
    for (int32_t g : processed.grid_thw) grids.push_back(g);
  }
  if (pixels.empty()) return absl::OkStatus();
  out.pixel_values = torch::cat(pixels, 0);
  out.image_grid_thw =
      torch::tensor(grids, torch::kInt64).view({static_cast<int64_t>(pixels.size()), 3});
  return absl::OkStatus();
}

absl::StatusOr<Request> ParseRequest(const std::string& request_path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(request_path));
  const json request = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return absl::InvalidArgumentError("request: not a JSON object");
  }
  if (!request.contains("input_ids")) {
    return absl::InvalidArgumentError("request: input_ids: required field is missing");
  }
  Request out;
  ASSIGN_OR_RETURN(out.rows, IntRows(request, "input_ids"));
  if (request.contains("attention_mask") && !request["attention_mask"].is_null()) {
    ASSIGN_OR_RETURN(auto mask, IntRows(request, "attention_mask"));
    if (mask.size() != out.rows.size()) {
      return absl::InvalidArgumentError(
          "request: attention_mask: row count differs from input_ids");
    }
    for (size_t r = 0; r < mask.size(); ++r) {
      if (mask[r].size() != out.rows[r].size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("request: attention_mask: row ", r, " differs in length from input_ids"));
      }
      std::vector<int64_t> kept;
      for (size_t j = 0; j < mask[r].size(); ++j) {
        if (mask[r][j] != 0 && mask[r][j] != 1) {
          return absl::InvalidArgumentError("request: attention_mask: entries must be 0 or 1");
        }
        if (mask[r][j] == 1) kept.push_back(out.rows[r][j]);
      }
      if (kept.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("request: attention_mask: row ", r, " keeps no token"));
      }
      out.rows[r] = std::move(kept);
    }
  }
  const bool has_file =
      request.contains("pixel_values_file") && !request["pixel_values_file"].is_null();
  const bool has_images = request.contains("images") && !request["images"].is_null();
  if (has_file && has_images) {
    return absl::InvalidArgumentError("request: give images or pixel_values_file, not both");
  }
  if (has_file) {
    if (!request["pixel_values_file"].is_string()) {
      return absl::InvalidArgumentError("request: pixel_values_file: expected a path");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<model::SafetensorsFile> images,
                     model::SafetensorsFile::Open(request["pixel_values_file"].get<std::string>()));
    ASSIGN_OR_RETURN(out.pixel_values, images->Get("pixel_values", torch::kFloat32));
    ASSIGN_OR_RETURN(out.image_grid_thw, images->Get("image_grid_thw", torch::kInt64));
    if (out.image_grid_thw.dim() != 2 || out.image_grid_thw.size(1) != 3) {
      return absl::InvalidArgumentError(
          "request: pixel_values_file: image_grid_thw must be [n, 3]");
    }
  }
  if (has_images) {
    const std::filesystem::path folder = std::filesystem::path(request_path).parent_path();
    RETURN_IF_ERROR(LoadImages(request["images"], folder, out));
  }
  return out;
}

absl::Status WriteOutput(const std::string& path, const model::GenerationOutput& generated) {
  json out = json::object();
  out["generated"] = generated.tokens;
  out["stopped"] = generated.stopped;
  std::ofstream file(path, std::ios::trunc);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot write ", path));
  file << out.dump() << "\n";
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

// RunGenerate without the c10::Error conversion.
absl::Status RunGenerateOrThrow(const std::string& model_dir, const std::string& request_path,
                                const std::string& out_path, const GenerateToolOptions& options) {
  ASSIGN_OR_RETURN(Request request, ParseRequest(request_path));
  ASSIGN_OR_RETURN(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                   model::LoadHfModel(model_dir, options.forward.dtype));
  const model::Qwen2VLConfig& config = model->config();
  std::vector<int64_t> merged;
  if (request.image_grid_thw.defined()) {
    const int64_t merge = config.vision.spatial_merge_size;
    const torch::Tensor grid = request.image_grid_thw.contiguous();
    const auto g = grid.accessor<int64_t, 2>();
    for (int64_t i = 0; i < grid.size(0); ++i) {
      merged.push_back(g[i][0] * g[i][1] * g[i][2] / (merge * merge));
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> rows,
                   ExpandImagePads(request.rows, merged, config.image_token_id));

  GenerateToolOptions run = options;
  const SpecialTokens special = ReadSpecialTokens(model_dir);
  run.generation.eos_token_ids = special.eos_token_ids;
  run.generation.pad_token_id = special.pad_token_id;
  ASSIGN_OR_RETURN(model::ModelInputs inputs, model::LeftPadPrompts(rows, special.pad_token_id));
  inputs.pixel_values = request.pixel_values;
  inputs.image_grid_thw = request.image_grid_thw;

  model->to(options.forward.device);
  model->SetAttentionImpl(options.forward.attention);
  model->eval();
  ASSIGN_OR_RETURN(model::GenerationOutput generated,
                   model::Generate(*model, inputs, run.generation));
  return WriteOutput(out_path, generated);
}

}  // namespace

absl::StatusOr<GenerateToolOptions> ParseGenerateToolOptions(
    const std::map<std::string, std::string>& flags) {
  auto flag = [&flags](const char* name) {
    auto it = flags.find(name);
    return it == flags.end() ? std::string() : it->second;
  };
  GenerateToolOptions options;
  ASSIGN_OR_RETURN(options.forward,
                   model::ParseForwardOptions(flag("device"), flag("dtype"), flag("attention")));
  model::GenerationOptions& g = options.generation;
  g.temperature = 0;
  auto bad = [](const char* name, const std::string& value) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": bad value '", value, "'"));
  };
  const std::string max_new = flag("max_new_tokens");
  if (!absl::SimpleAtoi(max_new, &g.max_new_tokens) || g.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_new_tokens: a positive integer is required, got '", max_new, "'"));
  }
  if (flags.count("temperature") &&
      (!absl::SimpleAtod(flag("temperature"), &g.temperature) || g.temperature < 0)) {
    return bad("temperature", flag("temperature"));
  }
  if (flags.count("top_p") &&
      (!absl::SimpleAtod(flag("top_p"), &g.top_p) || !(g.top_p > 0 && g.top_p <= 1))) {
    return bad("top_p", flag("top_p"));
  }
  if (flags.count("top_k") && (!absl::SimpleAtoi(flag("top_k"), &g.top_k) || g.top_k < 0)) {
    return bad("top_k", flag("top_k"));
  }
  if (flags.count("seed") && !absl::SimpleAtoi(flag("seed"), &g.seed)) {
    return bad("seed", flag("seed"));
  }
  return options;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ExpandImagePads(
    const std::vector<std::vector<int64_t>>& rows, const std::vector<int64_t>& merged_tokens,
    int64_t image_pad_id) {
  std::vector<std::vector<int64_t>> out;
  size_t image = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<int64_t>& row = rows[r];
    out.emplace_back();
    for (size_t j = 0; j < row.size();) {
      if (row[j] != image_pad_id) {
        out.back().push_back(row[j++]);
        continue;
      }
      size_t end = j;
      while (end < row.size() && row[end] == image_pad_id) ++end;
      const auto run = static_cast<int64_t>(end - j);
      if (image >= merged_tokens.size()) {
        return absl::InvalidArgumentError(absl::StrCat("request: row ", r,
                                                       " holds more <|image_pad|> runs than the ",
                                                       merged_tokens.size(), " images"));
      }
      const int64_t want = merged_tokens[image];
      if (run != 1 && run != want) {
        return absl::InvalidArgumentError(
            absl::StrCat("request: row ", r, ": image ", image, " needs ", want,
                         " <|image_pad|> tokens (or a single one to expand), got ", run));
      }
      out.back().insert(out.back().end(), static_cast<size_t>(want), image_pad_id);
      ++image;
      j = end;
    }
  }
  if (image != merged_tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", merged_tokens.size(),
                                                   " images but ", image,
                                                   " <|image_pad|> runs in input_ids"));
  }
  return out;
}

SpecialTokens ReadSpecialTokens(const std::string& model_dir) {
  const std::string generation = model_dir + "/generation_config.json";
  const std::string config = model_dir + "/config.json";
  SpecialTokens tokens;
  tokens.eos_token_ids = IdsAt(generation, "eos_token_id");
  if (tokens.eos_token_ids.empty()) tokens.eos_token_ids = IdsAt(config, "eos_token_id");
  if (tokens.eos_token_ids.empty()) {
    tokens.eos_token_ids = {model::kImEndTokenId, model::kEndOfTextTokenId};
  }
  std::vector<int64_t> pad = IdsAt(generation, "pad_token_id");
  if (pad.empty()) pad = IdsAt(config, "pad_token_id");
  if (pad.size() == 1 && pad[0] >= 0) tokens.pad_token_id = pad[0];
  return tokens;
}

absl::Status RunGenerate(const std::string& model_dir, const std::string& request_path,
                         const std::string& out_path, const GenerateToolOptions& options) {
  try {
    return RunGenerateOrThrow(model_dir, request_path, out_path, options);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
}

}  // namespace trainctl::trainer
