#include "worker/trainer/model/qwen2vl_config.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

#ifndef TRAINCTL_MODEL_REGISTRY_DIR
#define TRAINCTL_MODEL_REGISTRY_DIR "configs/models"
#endif

namespace trainctl::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Reads typed keys from one JSON object, naming `prefix + key` and the file in errors.
class KeyReader {
 public:
  KeyReader(const json* object, std::string prefix, const std::string* source)
      : object_(object), prefix_(std::move(prefix)), source_(source) {}

  bool Has(const std::string& key) const {
    return object_ != nullptr && object_->contains(key) && !(*object_)[key].is_null();
  }
  const json& Get(const std::string& key) const { return (*object_)[key]; }
  std::string Name(const std::string& key) const { return prefix_ + key; }

  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(*source_, ": ", Name(key), ": ", what));
  }

  absl::Status Int(const std::string& key, int64_t* out) const {
    const json& v = Get(key);
    if (v.is_number_integer()) {
      *out = v.get<int64_t>();
      return absl::OkStatus();
    }
    // Some exporters write integral values as 2.0.
    if (v.is_number_float() && v.get<double>() == static_cast<double>(v.get<int64_t>())) {
      *out = v.get<int64_t>();
      return absl::OkStatus();
    }
    return Error(key, absl::StrCat("expected an integer, got ", v.dump()));
  }
  absl::Status Double(const std::string& key, double* out) const {
    const json& v = Get(key);
    if (!v.is_number()) return Error(key, absl::StrCat("expected a number, got ", v.dump()));
    *out = v.get<double>();
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& key, bool* out) const {
    const json& v = Get(key);
    if (!v.is_boolean()) return Error(key, absl::StrCat("expected true or false, got ", v.dump()));
    *out = v.get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(const std::string& key, std::string* out) const {
    const json& v = Get(key);
    if (!v.is_string()) return Error(key, absl::StrCat("expected a string, got ", v.dump()));
    *out = v.get<std::string>();
    return absl::OkStatus();
  }

 private:
  const json* object_;
  std::string prefix_;
  const std::string* source_;
};

// Text keys live under `text_config` in the newer layout and at the top in the published one;
// the first reader that has a key answers for it.
class LayeredReader {
 public:
  explicit LayeredReader(std::vector<KeyReader> layers) : layers_(std::move(layers)) {}

  const KeyReader* Find(const std::string& key) const {
    for (const KeyReader& layer : layers_) {
      if (layer.Has(key)) return &layer;
    }
    return nullptr;
  }
  absl::Status Missing(const std::string& key) const {
    return layers_.front().Error(key, "required key is missing");
  }

  template <typename T, typename Fn>
  absl::Status Required(const std::string& key, T* out, Fn read) const {
    const KeyReader* r = Find(key);
    if (r == nullptr) return Missing(key);
    return read(*r, key, out);
  }
  template <typename T, typename Fn>
  absl::Status Optional(const std::string& key, T* out, Fn read) const {
    const KeyReader* r = Find(key);
    if (r == nullptr) return absl::OkStatus();
    return read(*r, key, out);
  }

 private:
  std::vector<KeyReader> layers_;
};

absl::Status ReadInt(const KeyReader& r, const std::string& key, int64_t* out) {
  return r.Int(key, out);
}
absl::Status ReadDouble(const KeyReader& r, const std::string& key, double* out) {
  return r.Double(key, out);
}
absl::Status ReadBool(const KeyReader& r, const std::string& key, bool* out) {
  return r.Bool(key, out);
}
absl::Status ReadString(const KeyReader& r, const std::string& key, std::string* out) {
  return r.String(key, out);
}

absl::Status ReadMropeSection(const LayeredReader& text, const std::string& source,
                              std::vector<int64_t>* out) {
  // rope_scaling.mrope_section (HF 4.x), or rope_parameters.mrope_section (HF 5).
  for (const char* holder : {"rope_scaling", "rope_parameters"}) {
    const KeyReader* r = text.Find(holder);
    if (r == nullptr) continue;
    const json& obj = r->Get(holder);
    if (!obj.is_object()) return r->Error(holder, "expected an object");
    KeyReader inner(&obj, r->Name(holder) + ".", &source);
    if (!inner.Has("mrope_section")) continue;
    const json& v = inner.Get("mrope_section");
    if (!v.is_array() || v.size() != 3) {
      return inner.Error("mrope_section", "expected an array of 3 integers (t, h, w)");
    }
    out->clear();
    for (const json& item : v) {
      if (!item.is_number_integer() || item.get<int64_t>() <= 0) {
        return inner.Error("mrope_section", "expected positive integers, got " + v.dump());
      }
      out->push_back(item.get<int64_t>());
    }
    return absl::OkStatus();
  }
  return text.Missing("rope_scaling.mrope_section");
}

// HF's model_type, else the architectures' class names, else Qwen2-VL (older exports).
absl::Status ReadFamily(const json& root, const std::string& source, ModelFamily* family) {
  auto error = [&source](const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", what));
  };
  std::optional<ModelFamily> from_type, from_arch;
  if (const auto type = root.find("model_type"); type != root.end() && !type->is_null()) {
    if (!type->is_string()) return error("model_type", "expected a string, got " + type->dump());
    const std::string name = type->get<std::string>();
    if (name == "qwen2_vl") {
      from_type = ModelFamily::kQwen2VL;
    } else if (name == "qwen2_5_vl") {
      from_type = ModelFamily::kQwen25VL;
    } else {
      return error(
          "model_type",
          absl::StrCat("\"", name, "\" is not a model trainctl trains (qwen2_vl, qwen2_5_vl)"));
    }
  }
  if (const auto arch = root.find("architectures"); arch != root.end() && arch->is_array()) {
    for (const json& name : *arch) {
      if (!name.is_string()) continue;
      const std::string n = name.get<std::string>();
      if (absl::StartsWith(n, "Qwen2_5_VL")) from_arch = ModelFamily::kQwen25VL;
      if (absl::StartsWith(n, "Qwen2VL")) from_arch = ModelFamily::kQwen2VL;
    }
  }
  if (from_type && from_arch && *from_type != *from_arch) {
    return error("architectures", absl::StrCat("names another model than model_type \"",
                                               root["model_type"].get<std::string>(), "\""));
  }
  *family = from_type.value_or(from_arch.value_or(ModelFamily::kQwen2VL));
  return absl::OkStatus();
}

absl::Status ReadIntList(const KeyReader& r, const std::string& key, std::vector<int64_t>* out) {
  const json& v = r.Get(key);
  if (!v.is_array()) return r.Error(key, "expected an array of integers, got " + v.dump());
  out->clear();
  for (const json& item : v) {
    if (!item.is_number_integer()) {
      return r.Error(key, "expected an array of integers, got " + v.dump());
    }
    out->push_back(item.get<int64_t>());
  }
  return absl::OkStatus();
}

// Qwen2VLVisionConfig's keys; the sizes are required (the published configs have them all).
absl::Status ReadQwen2Vision(const LayeredReader& r, Qwen2VLVisionConfig* v) {
  RETURN_IF_ERROR(r.Required("depth", &v->depth, ReadInt));
  RETURN_IF_ERROR(r.Required("embed_dim", &v->embed_dim, ReadInt));
  RETURN_IF_ERROR(r.Required("num_heads", &v->num_heads, ReadInt));
  RETURN_IF_ERROR(r.Required("hidden_size", &v->hidden_size, ReadInt));
  RETURN_IF_ERROR(r.Optional("mlp_ratio", &v->mlp_ratio, ReadDouble));
  return absl::OkStatus();
}

// Qwen2_5_VLVisionConfig's keys, each defaulting as in HF's class: transformers' save_pretrained
// leaves out the values equal to those defaults.
absl::Status ReadQwen25Vision(const LayeredReader& r, Qwen2VLVisionConfig* v) {
  v->depth = 32;
  v->embed_dim = 3584;
  v->hidden_act = "silu";
  v->intermediate_size = 3420;
  v->num_heads = 16;
  v->tokens_per_second = 4;
  v->window_size = 112;
  v->hidden_size = 3584;
  v->fullatt_block_indexes = {7, 15, 23, 31};
  RETURN_IF_ERROR(r.Optional("depth", &v->depth, ReadInt));
  RETURN_IF_ERROR(r.Optional("hidden_size", &v->embed_dim, ReadInt));
  RETURN_IF_ERROR(r.Optional("intermediate_size", &v->intermediate_size, ReadInt));
  RETURN_IF_ERROR(r.Optional("num_heads", &v->num_heads, ReadInt));
  RETURN_IF_ERROR(r.Optional("out_hidden_size", &v->hidden_size, ReadInt));
  RETURN_IF_ERROR(r.Optional("window_size", &v->window_size, ReadInt));
  RETURN_IF_ERROR(r.Optional("fullatt_block_indexes", &v->fullatt_block_indexes, ReadIntList));
  RETURN_IF_ERROR(r.Optional("tokens_per_second", &v->tokens_per_second, ReadInt));
  return absl::OkStatus();
}

absl::Status ReadVision(const json& root, const std::string& source, ModelFamily family,
                        Qwen2VLVisionConfig* v) {
  KeyReader top(&root, "", &source);
  if (!top.Has("vision_config")) return top.Error("vision_config", "required key is missing");
  const json& obj = root["vision_config"];
  if (!obj.is_object()) return top.Error("vision_config", "expected an object");
  LayeredReader r({KeyReader(&obj, "vision_config.", &source)});
  v->family = family;
  if (family == ModelFamily::kQwen25VL) {
    RETURN_IF_ERROR(ReadQwen25Vision(r, v));
  } else {
    RETURN_IF_ERROR(ReadQwen2Vision(r, v));
  }
  RETURN_IF_ERROR(r.Optional("patch_size", &v->patch_size, ReadInt));
  RETURN_IF_ERROR(r.Optional("temporal_patch_size", &v->temporal_patch_size, ReadInt));
  RETURN_IF_ERROR(r.Optional("spatial_merge_size", &v->spatial_merge_size, ReadInt));
  // The published configs say in_chans; HF's class says in_channels.
  RETURN_IF_ERROR(r.Optional("in_chans", &v->in_channels, ReadInt));
  RETURN_IF_ERROR(r.Optional("in_channels", &v->in_channels, ReadInt));
  RETURN_IF_ERROR(r.Optional("hidden_act", &v->hidden_act, ReadString));
  return absl::OkStatus();
}

absl::Status InvalidKey(const Qwen2VLConfig& c, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(c.source, ": ", key, ": ", what));
}

// The vision keys as the config's family names them.
absl::Status ValidateVision(const Qwen2VLConfig& c) {
  const Qwen2VLVisionConfig& v = c.vision;
  const bool v25 = v.windowed();
  const std::string width_key = v25 ? "vision_config.hidden_size" : "vision_config.embed_dim";
  const std::string out_key = v25 ? "vision_config.out_hidden_size" : "vision_config.hidden_size";
  const std::pair<std::string, int64_t> positives[] = {
      {"vision_config.depth", v.depth},
      {width_key, v.embed_dim},
      {"vision_config.num_heads", v.num_heads},
      {out_key, v.hidden_size},
      {"vision_config.patch_size", v.patch_size},
      {"vision_config.temporal_patch_size", v.temporal_patch_size},
      {"vision_config.spatial_merge_size", v.spatial_merge_size},
      {"vision_config.in_channels", v.in_channels},
      {v25 ? "vision_config.intermediate_size" : "vision_config.mlp_ratio", v.mlp_hidden_dim()},
  };
  for (const auto& [key, value] : positives) {
    if (value <= 0) return InvalidKey(c, key, absl::StrCat("must be positive, got ", value));
  }
  if (v.hidden_size != c.hidden_size) {
    return InvalidKey(c, out_key,
                      absl::StrCat("must equal hidden_size ", c.hidden_size,
                                   " (the merger feeds "
                                   "the decoder), got ",
                                   v.hidden_size));
  }
  const std::vector<std::string> acts =
      v25 ? std::vector<std::string>{"silu", "gelu", "gelu_pytorch_tanh", "quick_gelu"}
          : std::vector<std::string>{"quick_gelu"};
  if (std::find(acts.begin(), acts.end(), v.hidden_act) == acts.end()) {
    return InvalidKey(
        c, "vision_config.hidden_act",
        absl::StrCat("\"", v.hidden_act, "\" is not an activation of this vision tower (",
                     absl::StrJoin(acts, ", "), ")"));
  }
  if (v.embed_dim % v.num_heads != 0) {
    return InvalidKey(
        c, "vision_config.num_heads",
        absl::StrCat("must divide ", width_key, " ", v.embed_dim, ", got ", v.num_heads));
  }
  if (v.head_dim() % 4 != 0) {
    return InvalidKey(c, "vision_config.num_heads",
                      absl::StrCat("vision head_dim ", v.head_dim(),
                                   " must be a multiple of 4 (2-D rotary over h and w)"));
  }
  if (!v25) return absl::OkStatus();
  const int64_t unit = v.patch_size * v.spatial_merge_size;
  if (v.window_size <= 0 || v.window_size % unit != 0) {
    return InvalidKey(c, "vision_config.window_size",
                      absl::StrCat("must be a positive multiple of patch_size x "
                                   "spatial_merge_size = ",
                                   unit, ", got ", v.window_size));
  }
  for (const int64_t index : v.fullatt_block_indexes) {
    if (index < 0 || index >= v.depth) {
      return InvalidKey(c, "vision_config.fullatt_block_indexes",
                        absl::StrCat("block ", index, " is outside the ", v.depth,
                                     " blocks (vision_config.depth)"));
    }
  }
  if (v.tokens_per_second < 0) {
    return InvalidKey(c, "vision_config.tokens_per_second", "must not be negative");
  }
  return absl::OkStatus();
}

absl::Status Validate(const Qwen2VLConfig& c) {
  auto bad = [&c](const std::string& key, const std::string& what) {
    return InvalidKey(c, key, what);
  };
  const std::pair<const char*, int64_t> positives[] = {
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& [key, value] : positives) {
    if (value <= 0) return bad(key, absl::StrCat("must be positive, got ", value));
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return bad("num_attention_heads", absl::StrCat("must divide hidden_size ", c.hidden_size,
                                                   ", got ", c.num_attention_heads));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad("num_key_value_heads",
               absl::StrCat("must divide num_attention_heads ", c.num_attention_heads, ", got ",
                            c.num_key_value_heads));
  }
  if (c.head_dim() % 2 != 0) {
    return bad("num_attention_heads", absl::StrCat("head_dim ", c.head_dim(), " must be even"));
  }
  const int64_t section_sum =
      std::accumulate(c.mrope_section.begin(), c.mrope_section.end(), int64_t{0});
  if (section_sum != c.head_dim() / 2) {
    return bad("rope_scaling.mrope_section",
               absl::StrCat("must sum to head_dim / 2 = ", c.head_dim() / 2, ", got [",
                            absl::StrJoin(c.mrope_section, ", "), "]"));
  }
  if (c.rms_norm_eps <= 0) return bad("rms_norm_eps", "must be positive");
  if (c.rope_theta <= 0) return bad("rope_theta", "must be positive");
  if (c.hidden_act != "silu") {
    return bad("hidden_act",
               absl::StrCat("only \"silu\" is implemented, got \"", c.hidden_act, "\""));
  }
  return ValidateVision(c);
}

// A *ForSequenceClassification architecture's label count, as HF's PretrainedConfig derives it:
// len(id2label) when present, else num_labels, else 2. 0 for any other architecture.
absl::Status ReadNumLabels(const json& root, const std::string& source, int64_t* out) {
  *out = 0;
  const auto arch = root.find("architectures");
  if (arch == root.end() || !arch->is_array()) return absl::OkStatus();
  bool classifier = false;
  for (const json& name : *arch) {
    classifier |=
        name.is_string() && absl::EndsWith(name.get<std::string>(), "ForSequenceClassification");
  }
  if (!classifier) return absl::OkStatus();
  *out = 2;
  if (const auto labels = root.find("id2label"); labels != root.end() && labels->is_object()) {
    *out = static_cast<int64_t>(labels->size());
  } else if (const auto n = root.find("num_labels"); n != root.end()) {
    if (!n->is_number_integer()) {
      return absl::InvalidArgumentError(source + ": num_labels: expected an integer");
    }
    *out = n->get<int64_t>();
  }
  if (*out < 1) {
    return absl::InvalidArgumentError(source +
                                      ": a *ForSequenceClassification model needs at "
                                      "least one label (id2label / num_labels)");
  }
  return absl::OkStatus();
}

// vision_config's keys as the family's HF class names them (Qwen2-VL's or Qwen2.5-VL's), the
// other family's removed.
void WriteVision(const Qwen2VLVisionConfig& c, json& v) {
  if (c.windowed()) {
    for (const char* key : {"embed_dim", "mlp_ratio"}) v.erase(key);
    v["hidden_size"] = c.embed_dim;
    v["intermediate_size"] = c.intermediate_size;
    v["out_hidden_size"] = c.hidden_size;
    v["window_size"] = c.window_size;
    v["fullatt_block_indexes"] = c.fullatt_block_indexes;
    v["tokens_per_second"] = c.tokens_per_second;
  } else {
    for (const char* key : {"intermediate_size", "out_hidden_size", "window_size",
                            "fullatt_block_indexes", "tokens_per_second"}) {
      v.erase(key);
    }
    v["embed_dim"] = c.embed_dim;
    v["mlp_ratio"] = c.mlp_ratio;
    v["hidden_size"] = c.hidden_size;
  }
  v["depth"] = c.depth;
  v["num_heads"] = c.num_heads;
  v["patch_size"] = c.patch_size;
  v["spatial_patch_size"] = c.patch_size;
  v["temporal_patch_size"] = c.temporal_patch_size;
  v["spatial_merge_size"] = c.spatial_merge_size;
  v["in_chans"] = c.in_channels;
  v["in_channels"] = c.in_channels;
  v["hidden_act"] = c.hidden_act;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return text.str();
}

}  // namespace

bool Qwen2VLVisionConfig::FullAttentionBlock(int64_t index) const {
  return !windowed() || std::find(fullatt_block_indexes.begin(), fullatt_block_indexes.end(),
                                  index) != fullatt_block_indexes.end();
}

absl::StatusOr<Qwen2VLConfig> ParseQwen2VLConfig(const std::string& json_text,
                                                 const std::string& source) {
  json root = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(source + ": not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError(source + ": expected a JSON object");

  Qwen2VLConfig c;
  c.source = source;
  c.raw_json = json_text;

  std::vector<KeyReader> layers;
  if (root.contains("text_config")) {
    if (!root["text_config"].is_object()) {
      return absl::InvalidArgumentError(source + ": text_config: expected an object");
    }
    layers.emplace_back(&root["text_config"], "text_config.", &c.source);
  }
  layers.emplace_back(&root, "", &c.source);
  const LayeredReader text(std::move(layers));

  RETURN_IF_ERROR(text.Required("hidden_size", &c.hidden_size, ReadInt));
  RETURN_IF_ERROR(text.Required("intermediate_size", &c.intermediate_size, ReadInt));
  RETURN_IF_ERROR(text.Required("num_hidden_layers", &c.num_hidden_layers, ReadInt));
  RETURN_IF_ERROR(text.Required("num_attention_heads", &c.num_attention_heads, ReadInt));
  RETURN_IF_ERROR(text.Required("num_key_value_heads", &c.num_key_value_heads, ReadInt));
  RETURN_IF_ERROR(text.Required("rms_norm_eps", &c.rms_norm_eps, ReadDouble));
  RETURN_IF_ERROR(text.Required("vocab_size", &c.vocab_size, ReadInt));
  if (text.Find("rope_theta") != nullptr) {
    RETURN_IF_ERROR(text.Required("rope_theta", &c.rope_theta, ReadDouble));
  } else if (const KeyReader* r = text.Find("rope_parameters"); r != nullptr) {
    KeyReader inner(&r->Get("rope_parameters"), r->Name("rope_parameters."), &c.source);
    if (!inner.Has("rope_theta")) return text.Missing("rope_theta");
    RETURN_IF_ERROR(inner.Double("rope_theta", &c.rope_theta));
  } else {
    return text.Missing("rope_theta");
  }
  RETURN_IF_ERROR(ReadMropeSection(text, c.source, &c.mrope_section));
  RETURN_IF_ERROR(text.Optional("tie_word_embeddings", &c.tie_word_embeddings, ReadBool));
  RETURN_IF_ERROR(text.Optional("max_position_embeddings", &c.max_position_embeddings, ReadInt));
  RETURN_IF_ERROR(text.Optional("hidden_act", &c.hidden_act, ReadString));

  // Special token ids and dtype are top-level in both layouts.
  const LayeredReader top({KeyReader(&root, "", &c.source)});
  RETURN_IF_ERROR(top.Optional("image_token_id", &c.image_token_id, ReadInt));
  RETURN_IF_ERROR(top.Optional("video_token_id", &c.video_token_id, ReadInt));
  RETURN_IF_ERROR(top.Optional("vision_start_token_id", &c.vision_start_token_id, ReadInt));
  RETURN_IF_ERROR(top.Optional("vision_end_token_id", &c.vision_end_token_id, ReadInt));
  RETURN_IF_ERROR(text.Optional("torch_dtype", &c.torch_dtype, ReadString));

  ModelFamily family = ModelFamily::kQwen2VL;
  RETURN_IF_ERROR(ReadFamily(root, c.source, &family));
  RETURN_IF_ERROR(ReadVision(root, c.source, family, &c.vision));
  RETURN_IF_ERROR(ReadNumLabels(root, c.source, &c.num_labels));
  RETURN_IF_ERROR(Validate(c));
  return c;
}

absl::StatusOr<Qwen2VLConfig> LoadQwen2VLConfig(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(file));
  return ParseQwen2VLConfig(text, file);
}

std::string Qwen2VLConfigToJson(const Qwen2VLConfig& c) {
  json out = json::object();
  if (!c.raw_json.empty()) {
    json raw = json::parse(c.raw_json, nullptr, false);
    if (raw.is_object()) out = std::move(raw);
  }
  // Write the flat layout: fold a text_config back to the top.
  if (out.contains("text_config") && out["text_config"].is_object()) {
    for (const auto& [key, value] : out["text_config"].items()) {
      if (key != "model_type" && key != "architectures") out[key] = value;
    }
    out.erase("text_config");
  }
  out.erase("rope_parameters");
  const bool v25 = c.family() == ModelFamily::kQwen25VL;
  const std::string class_prefix = v25 ? "Qwen2_5_VL" : "Qwen2VL";
  if (c.num_labels > 0) {
    out["architectures"] = json::array({class_prefix + "ForSequenceClassification"});
    if (!out.contains("id2label") || !out["id2label"].is_object() ||
        static_cast<int64_t>(out["id2label"].size()) != c.num_labels) {
      json id2label = json::object(), label2id = json::object();
      for (int64_t i = 0; i < c.num_labels; ++i) {
        id2label[std::to_string(i)] = absl::StrCat("LABEL_", i);
        label2id[absl::StrCat("LABEL_", i)] = i;
      }
      out["id2label"] = std::move(id2label);
      out["label2id"] = std::move(label2id);
    }
  } else {
    out["architectures"] = json::array({class_prefix + "ForConditionalGeneration"});
  }
  out["model_type"] = v25 ? "qwen2_5_vl" : "qwen2_vl";
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["rope_theta"] = c.rope_theta;
  out["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", c.mrope_section}};
  out["vocab_size"] = c.vocab_size;
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["hidden_act"] = c.hidden_act;
  out["image_token_id"] = c.image_token_id;
  out["video_token_id"] = c.video_token_id;
  out["vision_start_token_id"] = c.vision_start_token_id;
  out["vision_end_token_id"] = c.vision_end_token_id;
  if (!c.torch_dtype.empty()) out["torch_dtype"] = c.torch_dtype;
  json& v = out["vision_config"];
  if (!v.is_object()) v = json::object();
  WriteVision(c.vision, v);
  return out.dump(2) + "\n";
}

std::string ModelRegistryDir() { return TRAINCTL_MODEL_REGISTRY_DIR; }

absl::StatusOr<std::string> FindModelConfig(const std::string& name_or_dir,
                                            const std::string& registry) {
  std::vector<std::string> tried;
  std::error_code ec;
  const fs::path given(name_or_dir);
  if (fs::is_regular_file(given, ec)) return given.string();
  if (fs::is_directory(given, ec)) {
    const fs::path file = given / "config.json";
    if (fs::is_regular_file(file, ec)) return file.string();
    tried.push_back(file.string());
  }
  std::string name = name_or_dir;
  if (name.rfind("Qwen/", 0) == 0) name = name.substr(5);
  if (!name.empty() && name.find("..") == std::string::npos) {
    const fs::path file =
        fs::path(registry.empty() ? ModelRegistryDir() : registry) / name / "config.json";
    if (fs::is_regular_file(file, ec)) return file.string();
    tried.push_back(file.string());
  }
  return absl::NotFoundError(absl::StrCat("no model config for \"", name_or_dir,
                                          "\" (tried: ", absl::StrJoin(tried, ", "), ")"));
}

}  // namespace trainctl::model
