#include "worker/trainer/model/state_dict_adapter.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/trainer/model/status_guard.h"

namespace trainctl::model {
namespace {

namespace fs = std::filesystem;

constexpr size_t kNamesInMessage = 8;

std::string ShapeString(torch::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "a, b, c (and 12 more)".
std::string FewNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kNamesInMessage));
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > shown.size()) {
    absl::StrAppend(&out, " (and ", names.size() - shown.size(), " more)");
  }
  return out;
}

bool IgnoredKey(const std::string& key, bool tied) {
  return (tied && key == "lm_head.weight") || absl::EndsWith(key, ".rotary_emb.inv_freq");
}

std::string DtypeName(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kFloat16:
      return "float16";
    case torch::kFloat64:
      return "float64";
    default:
      return "float32";
  }
}

}  // namespace

std::string ToModelKey(const std::string& key) {
  static constexpr char kLanguage[] = "model.language_model.";
  static constexpr char kVisual[] = "model.visual.";
  if (absl::StartsWith(key, kLanguage)) return "model." + key.substr(sizeof(kLanguage) - 1);
  if (absl::StartsWith(key, kVisual)) return "visual." + key.substr(sizeof(kVisual) - 1);
  return key;
}

absl::Status LoadHfCheckpoint(Qwen2VLForConditionalGeneration& model, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt, SafetensorsCheckpoint::Open(path));
  const bool tied = model.config().tie_word_embeddings;
  const auto params = model.named_parameters(/*recurse=*/true);

  std::map<std::string, std::string> source_of;  // model key -> checkpoint key
  std::vector<std::string> unexpected;
  for (const std::string& key : ckpt->names()) {
    const std::string model_key = ToModelKey(key);
    if (params.find(model_key) == nullptr) {
      if (!IgnoredKey(model_key, tied)) unexpected.push_back(key);
      continue;
    }
    auto [it, inserted] = source_of.emplace(model_key, key);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tensors ", it->second, " and ", key, " in ",
                                                     ckpt->path(), " both map to ", model_key));
    }
  }
  std::vector<std::string> missing;
  for (const auto& item : params) {
    if (source_of.count(item.key()) == 0) missing.push_back(item.key());
  }
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat("tensor ", missing.front(), " is missing from ",
                                            ckpt->path(), "; missing: ", FewNames(missing)));
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", unexpected.front(), " in ", ckpt->FileOf(unexpected.front()),
                     " is not a parameter of this model; unexpected: ", FewNames(unexpected)));
  }
  for (const auto& [model_key, key] : source_of) {
    const SafetensorInfo* info = ckpt->Find(key);
    const torch::Tensor& param = params[model_key];
    if (torch::IntArrayRef(info->shape) != param.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", key, " in ", ckpt->FileOf(key), " has shape ", ShapeString(info->shape),
          " but the model's ", model_key, " is ", ShapeString(param.sizes())));
    }
  }

  torch::NoGradGuard no_grad;
  for (const auto& [model_key, key] : source_of) {
    torch::Tensor param = params[model_key];
    ASSIGN_OR_RETURN(torch::Tensor value, ckpt->Get(key, param.scalar_type()));
    RETURN_IF_ERROR(Guarded(
        absl::StrCat("copying tensor ", key, " from ", ckpt->FileOf(key), " into ", model_key),
        [&] { param.copy_(value); }));
  }
  return absl::OkStatus();
}

absl::Status SaveHfCheckpoint(const Qwen2VLForConditionalGeneration& model, const std::string& dir,
                              const SaveOptions& options) {
  std::vector<NamedTensor> tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    tensors.push_back({item.key(), item.value().detach()});
  }
  return SaveHfTensors(model.config(), std::move(tensors), dir, options);
}

absl::Status SaveHfTensors(const Qwen2VLConfig& model_config, std::vector<NamedTensor> tensors,
                           const std::string& dir, const SaveOptions& options) {
  std::optional<torch::ScalarType> saved_dtype = options.dtype;
  for (NamedTensor& t : tensors) {
    if (options.dtype.has_value()) t.tensor = t.tensor.to(*options.dtype);
    if (!saved_dtype.has_value()) saved_dtype = t.tensor.scalar_type();
  }
  RETURN_IF_ERROR(WriteSafetensorsCheckpoint(dir, tensors, options.sharding));

  Qwen2VLConfig config = model_config;
  if (saved_dtype.has_value()) config.torch_dtype = DtypeName(*saved_dtype);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string tmp = config_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << Qwen2VLConfigToJson(config);
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, config_path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Qwen2VLForConditionalGeneration>> LoadHfModel(
    const std::string& dir, torch::ScalarType dtype) {
  ASSIGN_OR_RETURN(Qwen2VLConfig config, LoadQwen2VLConfig(dir));
  std::shared_ptr<Qwen2VLForConditionalGeneration> model;
  RETURN_IF_ERROR(Guarded(
      absl::StrCat("building the model of ", config.source),
      [&] {
        model = std::make_shared<Qwen2VLForConditionalGeneration>(config);
        model->to(dtype);
      },
      absl::StatusCode::kResourceExhausted));
  RETURN_IF_ERROR(LoadHfCheckpoint(*model, dir));
  return model;
}

}  // namespace trainctl::model
