#include "common/model_catalog.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace trainctl {
namespace {

// The published config.json of each hub model (text sizes; the vision towers below).
struct KnownShape {
  const char* id;  // lower-case, without the owner
  bool qwen25;
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab;
  bool tied;
};
constexpr KnownShape kKnownShapes[] = {
    {"qwen2-vl-2b-instruct", false, 1536, 8960, 28, 12, 2, 151936, true},
    {"qwen2-vl-7b-instruct", false, 3584, 18944, 28, 28, 4, 152064, false},
    {"qwen2-vl-72b-instruct", false, 8192, 29568, 80, 64, 8, 152064, false},
    {"qwen2.5-vl-3b-instruct", true, 2048, 11008, 36, 16, 2, 151936, true},
    {"qwen2.5-vl-7b-instruct", true, 3584, 18944, 28, 28, 4, 152064, false},
    {"qwen2.5-vl-32b-instruct", true, 5120, 27648, 64, 40, 8, 152064, false},
    {"qwen2.5-vl-72b-instruct", true, 8192, 29568, 80, 64, 8, 152064, false},
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
  for (const KnownShape& k : kKnownShapes) {
    if (id == k.id || absl::StrCat(id, "-instruct") == k.id) return k.hidden;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Shapes

#ifndef TRAINCTL_MODEL_REGISTRY_DIR
#define TRAINCTL_MODEL_REGISTRY_DIR "configs/models"
#endif

namespace {

ModelShape FromKnown(const KnownShape& k) {
  ModelShape s;
  s.family = k.qwen25 ? "qwen2_5_vl" : "qwen2_vl";
  s.source = absl::StrCat("built-in table (", k.id, ")");
  s.hidden = k.hidden;
  s.intermediate = k.intermediate;
  s.layers = k.layers;
  s.heads = k.heads;
  s.kv_heads = k.kv_heads;
  s.vocab = k.vocab;
  s.tied = k.tied;
  // Every released tower: 32 blocks of width 1280 and 16 heads; Qwen2-VL's MLP is 4 x 1280 with
  // quick_gelu, Qwen2.5-VL's a SwiGLU of 3420 with 112-pixel windows and 4 full-attention blocks.
  s.vision.depth = 32;
  s.vision.embed = 1280;
  s.vision.heads = 16;
  s.vision.mlp = k.qwen25 ? 3420 : 5120;
  s.vision.window = k.qwen25 ? 112 : 0;
  s.vision.full_attention_blocks = k.qwen25 ? 4 : 0;
  return s;
}

absl::StatusOr<int64_t> PositiveInt(const nlohmann::json& section, const char* key,
                                    const std::string& where, const std::string& source) {
  const auto it = section.find(key);
  if (it == section.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", where, key, ": ",
                     it == section.end() ? "missing" : "must be a positive integer"));
  }
  return it->get<int64_t>();
}

int64_t IntOr(const nlohmann::json& section, const char* key, int64_t fallback) {
  const auto it = section.find(key);
  return it != section.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

absl::Status ParseVisionShape(const nlohmann::json& v, const std::string& source, ModelShape* s) {
  ModelShape::Vision& vision = s->vision;
  // A key save_pretrained left out holds HF's class default (Qwen2VLVisionConfig,
  // Qwen2_5_VLVisionConfig); one that is there must be a positive integer.
  auto get = [&](const char* key, int64_t fallback, int64_t* out) -> absl::Status {
    if (!v.contains(key)) {
      *out = fallback;
      return absl::OkStatus();
    }
    auto value = PositiveInt(v, key, "vision_config.", source);
    if (!value.ok()) return value.status();
    *out = *value;
    return absl::OkStatus();
  };
  const bool q25 = s->qwen25();
  // Qwen2-VL names the width embed_dim (its hidden_size is the LLM's); Qwen2.5-VL hidden_size.
  for (auto [key, fallback, field] :
       {std::tuple{"depth", int64_t{32}, &vision.depth},
        {q25 ? "hidden_size" : "embed_dim", int64_t{q25 ? 3584 : 1280}, &vision.embed},
        {"num_heads", int64_t{16}, &vision.heads}}) {
    if (absl::Status st = get(key, fallback, field); !st.ok()) return st;
  }
  if (q25) {
    if (absl::Status st = get("intermediate_size", 3420, &vision.mlp); !st.ok()) return st;
    vision.window = IntOr(v, "window_size", 112);
    const auto full = v.find("fullatt_block_indexes");
    vision.full_attention_blocks =
        full != v.end() && full->is_array() ? static_cast<int64_t>(full->size()) : 4;
  } else {
    const auto ratio = v.find("mlp_ratio");
    const double r = ratio != v.end() && ratio->is_number() ? ratio->get<double>() : 4.0;
    vision.mlp = static_cast<int64_t>(static_cast<double>(vision.embed) * r);
  }
  vision.patch = IntOr(v, "patch_size", IntOr(v, "spatial_patch_size", 14));
  vision.temporal_patch = IntOr(v, "temporal_patch_size", 2);
  vision.merge = IntOr(v, "spatial_merge_size", 2);
  vision.in_channels = IntOr(v, "in_chans", IntOr(v, "in_channels", 3));
  return absl::OkStatus();
}

}  // namespace

ModelShape::UnitCounts ModelShape::Counts() const {
  UnitCounts c;
  const int64_t h = hidden, e = vision.embed, m = vision.mlp,
                merged = e * vision.merge * vision.merge;
  c.embed = vocab * h;
  c.patch_embed = patch_dim() * e;  // Conv3d without bias
  // norms (LayerNorm weight + bias, or RMSNorm weight), qkv and proj with biases, the MLP.
  const int64_t norms = qwen25() ? 2 * e : 4 * e;
  const int64_t mlp = qwen25() ? 3 * e * m + 2 * m + e : 2 * e * m + m + e;
  c.vision_block = norms + (3 * e * e + 3 * e) + (e * e + e) + mlp;
  const int64_t ln_q = qwen25() ? e : 2 * e;
  c.merger = ln_q + (merged * merged + merged) + (merged * h + h);
  // q, k, v with biases, o without; the SwiGLU MLP without biases; two RMSNorm weights. q and o
  // are q_dim() = h wide in a whole model, the rank's heads' share under split attention.
  const int64_t q = q_dim(), kv = kv_dim();
  c.decoder_layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * intermediate + 2 * h;
  // The final norm travels with the head.
  c.head = (num_labels > 0 ? num_labels * h : (tied ? 0 : vocab * h)) + h;
  return c;
}

std::vector<std::pair<std::string, int64_t>> ModelShape::Units() const {
  const UnitCounts c = Counts();
  std::vector<std::pair<std::string, int64_t>> units;
  units.emplace_back("embed", c.embed);
  units.emplace_back("patch_embed", c.patch_embed);
  for (int64_t i = 0; i < vision.depth; ++i) {
    units.emplace_back(absl::StrCat("vision.", i), c.vision_block);
  }
  units.emplace_back("merger", c.merger);
  for (int64_t i = 0; i < layers; ++i)
    units.emplace_back(absl::StrCat("layer.", i), c.decoder_layer);
  units.emplace_back("head", c.head);
  return units;
}

int64_t ModelShape::Parameters() const { return Sliced(1); }

int64_t ModelShape::Sliced(int64_t world) const {
  const UnitCounts c = Counts();
  auto slice = [world](int64_t n) { return (n + world - 1) / world; };
  return slice(c.embed) + slice(c.patch_embed) + vision.depth * slice(c.vision_block) +
         slice(c.merger) + layers * slice(c.decoder_layer) + slice(c.head);
}

int64_t ModelShape::LargestUnit() const {
  const UnitCounts c = Counts();
  return std::max({c.embed, c.patch_embed, c.vision_block, c.merger, c.decoder_layer, c.head});
}

int64_t ModelShape::LargestLayerParameters() const {
  const int64_t h = hidden, e = vision.embed, m = vision.mlp,
                merged = e * vision.merge * vision.merge;
  return std::max({vocab * h, num_labels > 0 || tied ? 0 : vocab * h, h * intermediate,
                   h * q_dim() + q_dim(), merged * merged + merged, merged * h + h,
                   3 * e * e + 3 * e, e * m + m, patch_dim() * e});
}

absl::StatusOr<ModelShape> ParseModelShape(absl::string_view json_text, const std::string& source) {
  const auto config = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  ModelShape s;
  s.source = source;
  const std::string type = config.value("model_type", std::string("qwen2_vl"));
  if (type != "qwen2_vl" && type != "qwen2_5_vl") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model_type: \"", type,
                     "\" is not a model trainctl trains (qwen2_vl, qwen2_5_vl)"));
  }
  s.family = type;
  const auto text_it = config.find("text_config");
  const nlohmann::json& text =
      text_it != config.end() && text_it->is_object() && text_it->contains("hidden_size") ? *text_it
                                                                                          : config;
  const std::string where = &text == &config ? "" : "text_config.";
  for (auto [key, field] : {std::pair{"hidden_size", &s.hidden},
                            {"intermediate_size", &s.intermediate},
                            {"num_hidden_layers", &s.layers},
                            {"num_attention_heads", &s.heads},
                            {"vocab_size", &s.vocab}}) {
    auto v = PositiveInt(text, key, where, source);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  s.kv_heads = IntOr(text, "num_key_value_heads", s.heads);
  s.tied = config.value("tie_word_embeddings", text.value("tie_word_embeddings", false));
  const auto arch = config.find("architectures");
  if (arch != config.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string() &&
      absl::StrContains((*arch)[0].get<std::string>(), "ForSequenceClassification")) {
    const auto labels = config.find("id2label");
    s.num_labels = labels != config.end() && labels->is_object() && !labels->empty()
                       ? static_cast<int64_t>(labels->size())
                       : IntOr(config, "num_labels", 2);
  }
  const auto vision = config.find("vision_config");
  if (vision == config.end() || !vision->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": vision_config: missing"));
  }
  if (absl::Status st = ParseVisionShape(*vision, source, &s); !st.ok()) return st;
  return s;
}

namespace {

// The shape in config file `file`, parsed once per version of the file (its modification time and
// size): submits plan from it, and reading and parsing it each time costs more than the plan.
// nullopt when `file` is not a regular file.
std::optional<absl::StatusOr<ModelShape>> ShapeOfFile(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  const fs::file_time_type time = fs::last_write_time(file, ec);
  const uintmax_t size = fs::file_size(file, ec);
  struct Entry {
    fs::file_time_type time;
    uintmax_t size;
    ModelShape shape;
  };
  static absl::Mutex mu;
  static auto* cache = new std::map<std::string, Entry>();
  {
    absl::MutexLock lock(&mu);
    const auto it = cache->find(file.string());
    if (it != cache->end() && it->second.time == time && it->second.size == size) {
      return absl::StatusOr<ModelShape>(it->second.shape);
    }
  }
  std::ifstream in(file);
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<ModelShape> shape = ParseModelShape(buffer.str(), file.string());
  if (shape.ok()) {
    absl::MutexLock lock(&mu);
    (*cache)[file.string()] = Entry{time, size, *shape};
  }
  return shape;
}

}  // namespace

absl::StatusOr<ModelShape> LookupModelShape(absl::string_view model, const std::string& registry) {
  namespace fs = std::filesystem;
  std::vector<std::string> tried;
  auto read = [&tried](const fs::path& file) {
    auto shape = ShapeOfFile(file);
    if (!shape) tried.push_back(file.string());
    return shape;
  };
  std::string path(model);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::error_code ec;
  const fs::path given(path);
  const fs::path direct = fs::is_directory(given, ec) ? given / "config.json" : given;
  if (!path.empty() && (fs::is_directory(given, ec) || absl::EndsWith(path, ".json"))) {
    if (auto shape = read(direct)) return *std::move(shape);
  }
  std::string name = path;
  if (absl::StartsWith(name, "Qwen/")) name = name.substr(5);
  if (!name.empty() && !absl::StrContains(name, "..") && !absl::StrContains(name, "/")) {
    const fs::path file =
        fs::path(registry.empty() ? TRAINCTL_MODEL_REGISTRY_DIR : registry) / name / "config.json";
    if (auto shape = read(file)) return *std::move(shape);
  }
  std::string id = absl::AsciiStrToLower(path);
  if (auto slash = id.rfind('/'); slash != std::string::npos) id = id.substr(slash + 1);
  for (const KnownShape& k : kKnownShapes) {
    if (id == k.id || absl::StrCat(id, "-instruct") == k.id) return FromKnown(k);
  }
  tried.push_back("the built-in table of Qwen2-VL and Qwen2.5-VL hub ids");
  return absl::NotFoundError(absl::StrCat("no model config for \"", model,
                                          "\" (tried: ", absl::StrJoin(tried, ", "), ")"));
}

}  // namespace trainctl
