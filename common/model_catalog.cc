#include "common/model_catalog.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace trainctl {
namespace {

struct KnownModel {
  const char* id;  // lower-case, without the owner
  int64_t hidden_size;
};

// From each model's published config.json.
constexpr KnownModel kKnownModels[] = {
    {"qwen2-vl-2b-instruct", 1536},    {"qwen2-vl-2b", 1536},
    {"qwen2-vl-7b-instruct", 3584},    {"qwen2-vl-7b", 3584},
    {"qwen2-vl-72b-instruct", 8192},   {"qwen2-vl-72b", 8192},
    {"qwen2.5-vl-3b-instruct", 2048},  {"qwen2.5-vl-7b-instruct", 3584},
    {"qwen2.5-vl-32b-instruct", 5120}, {"qwen2.5-vl-72b-instruct", 8192},
};

std::optional<int64_t> HiddenSizeFromConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const auto config = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return std::nullopt;
  for (const auto* section :
       {&config, config.contains("text_config") ? &config["text_config"] : nullptr}) {
    if (section != nullptr && section->is_object() && section->contains("hidden_size") &&
        (*section)["hidden_size"].is_number_integer()) {
      return (*section)["hidden_size"].get<int64_t>();
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> LookupHiddenSize(absl::string_view model_name_or_path) {
  std::string path(model_name_or_path);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (auto from_file = HiddenSizeFromConfigFile(path + "/config.json")) return from_file;

  std::string id = absl::AsciiStrToLower(path);
  if (auto slash = id.rfind('/'); slash != std::string::npos) id = id.substr(slash + 1);
  for (const KnownModel& model : kKnownModels) {
    if (id == model.id) return model.hidden_size;
  }
  return std::nullopt;
}

}  // namespace trainctl
