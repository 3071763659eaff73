// Facts about models that the control plane needs before any weights are loaded: the hidden size
// that DeepSpeed's hidden-size "auto" values are computed from (as the HF Trainer does from
// model.config.hidden_size), and the shape a memory plan counts bytes from (common/memory_plan.h).
#ifndef TRAINCTL_COMMON_MODEL_CATALOG_H_
#define TRAINCTL_COMMON_MODEL_CATALOG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// The model's (text) hidden size: from `<model_name_or_path>/config.json` when that file exists
// here
// (`hidden_size`, or `text_config.hidden_size` in the newer layout), else from the built-in table
// of Qwen2-VL / Qwen2.5-VL hub ids (with or without the "Qwen/" owner). nullopt when unknown; the
// trainer then resolves the remaining "auto" values from the checkpoint it loads.
std::optional<int64_t> LookupHiddenSize(absl::string_view model_name_or_path);

// The sizes of a Qwen2-VL or Qwen2.5-VL model that decide its parameter count and its activations.
struct ModelShape {
  std::string family = "qwen2_vl";  // HF model_type: "qwen2_vl" | "qwen2_5_vl"
  std::string source;               // the config file read, or "built-in table (<id>)"
  int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0;
  // The attention heads' width; 0: hidden / heads (a whole model). A tensor-parallel rank's shape
  // (common/memory_plan.cc) keeps the whole head_dim with heads / tp and kv_heads / tp.
  int64_t head_size = 0;
  bool tied = false;       // tie_word_embeddings: the head reads the embedding
  int64_t num_labels = 0;  // > 0: a *ForSequenceClassification `score` head instead of lm_head
  struct Vision {
    int64_t depth = 0, embed = 0, heads = 0, mlp = 0;  // mlp: the MLP's inner width
    int64_t patch = 14, temporal_patch = 2, merge = 2, in_channels = 3;
    int64_t window = 0;  // Qwen2.5-VL window_size in pixels; 0: every block sees the whole frame
    int64_t full_attention_blocks = 0;  // Qwen2.5-VL fullatt_block_indexes' count
  } vision;

  bool qwen25() const { return family == "qwen2_5_vl"; }
  int64_t head_dim() const { return head_size > 0 ? head_size : hidden / heads; }
  // q_proj's rows, o_proj's columns: heads x head_dim (hidden in a whole model).
  int64_t q_dim() const { return head_size > 0 ? heads * head_size : hidden; }
  int64_t kv_dim() const { return kv_heads * head_dim(); }
  int64_t patch_dim() const {
    return vision.in_channels * vision.temporal_patch * vision.patch * vision.patch;
  }
  // The ZeRO engine's units in its order, each with its parameter count: "embed", "patch_embed",
  // "vision.N", "merger", "layer.N", "head" (absent when tied: the head borrows the embedding).
  std::vector<std::pair<std::string, int64_t>> Units() const;
  // The parameters of each kind of unit (one vision block, one decoder layer).
  struct UnitCounts {
    int64_t embed = 0, patch_embed = 0, vision_block = 0, merger = 0, decoder_layer = 0, head = 0;
  };
  UnitCounts Counts() const;
  int64_t Parameters() const;
  // The elements one rank keeps when every unit is split over `world` ranks, rounded up per unit
  // as the ZeRO engine pads them; Sliced(1) == Parameters().
  int64_t Sliced(int64_t world) const;
  int64_t LargestUnit() const;
  // DeepSpeed's "largest layer": the most parameters one module holds directly (the embedding,
  // the head, or the merger's first linear), as model_to_params counts it.
  int64_t LargestLayerParameters() const;
};

// The shape from HF config.json text (flat or `text_config` layout; Qwen2-VL's or Qwen2.5-VL's
// vision_config). INVALID_ARGUMENT naming `source` and the key when a size is missing or not a
// positive integer.
absl::StatusOr<ModelShape> ParseModelShape(absl::string_view json_text, const std::string& source);

// The shape of `model`: `<model>/config.json` (or `model` itself when it is a config file), else
// `<registry>/<name>/config.json` (registry: the source tree's configs/models when empty; a
// leading "Qwen/" is ignored), else the built-in table of the published Qwen2-VL and Qwen2.5-VL
// configs. NOT_FOUND listing what was tried.
absl::StatusOr<ModelShape> LookupModelShape(absl::string_view model,
                                            const std::string& registry = "");

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_MODEL_CATALOG_H_
