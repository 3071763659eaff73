#include "worker/trainer/generate_tool.h"

#include <torch/torch.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/model/status_guard.h"

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

// The rows' real tokens: generate drops those the mask marks 0 and left-pads the rows itself.
absl::StatusOr<std::vector<std::vector<int64_t>>> UnmaskedRows(const ToolRequest& request) {
  if (request.attention_mask.empty()) return request.input_ids;
  std::vector<std::vector<int64_t>> rows;
  for (size_t r = 0; r < request.input_ids.size(); ++r) {
    rows.emplace_back();
    for (size_t j = 0; j < request.input_ids[r].size(); ++j) {
      if (request.attention_mask[r][j] == 1) rows.back().push_back(request.input_ids[r][j]);
    }
    if (rows.back().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request: attention_mask: row ", r, " keeps no token"));
    }
  }
  return rows;
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
  ASSIGN_OR_RETURN(ToolRequest request, ReadToolRequest(request_path));
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> unmasked, UnmaskedRows(request));
  ASSIGN_OR_RETURN(std::shared_ptr<model::Qwen2VLForConditionalGeneration> model,
                   model::LoadHfModel(model_dir, options.forward.dtype));
  const model::Qwen2VLConfig& config = model->config();
  ASSIGN_OR_RETURN(
      std::vector<std::vector<int64_t>> rows,
      ExpandImagePads(unmasked,
                      MergedImageTokens(request.image_grid_thw, config.vision.spatial_merge_size),
                      config.image_token_id));

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
  return model::Guarded(
      "", [&] { return RunGenerateOrThrow(model_dir, request_path, out_path, options); },
      absl::StatusCode::kInvalidArgument);
}

}  // namespace trainctl::trainer
