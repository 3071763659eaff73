#include "common/data/preprocessor_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainctl::data {

absl::StatusOr<ImageProcessorOptions> ReadPreprocessorConfig(const std::string& model_dir,
                                                             ImageProcessorOptions defaults) {
  const std::string path = model_dir + "/preprocessor_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return defaults;
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  auto bound = [&](const nlohmann::json& object, const char* key, const std::string& field,
                   int64_t* out) -> absl::Status {
    if (!object.contains(key) || object[key].is_null()) return absl::OkStatus();
    const nlohmann::json& v = object[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", field, ": expected a positive integer, got ", v.dump()));
    }
    *out = v.get<int64_t>();
    return absl::OkStatus();
  };
  ImageProcessorOptions out = defaults;
  if (doc.contains("size") && doc["size"].is_object()) {
    const nlohmann::json& size = doc["size"];
    if (absl::Status s = bound(size, "shortest_edge", "size.shortest_edge", &out.min_pixels);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = bound(size, "longest_edge", "size.longest_edge", &out.max_pixels);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = bound(doc, "min_pixels", "min_pixels", &out.min_pixels); !s.ok()) return s;
  if (absl::Status s = bound(doc, "max_pixels", "max_pixels", &out.max_pixels); !s.ok()) return s;
  if (out.max_pixels < out.min_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": max_pixels ", out.max_pixels,
                                                   " is below min_pixels ", out.min_pixels));
  }
  return out;
}

}  // namespace trainctl::data
