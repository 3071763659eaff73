// The hyper-parameters of Qwen2-VL and Qwen2.5-VL, read from a Hugging Face `config.json` (the
// published flat layout, or the newer one with the text fields under `text_config`), and the
// registry of named configs under `configs/models/` ("tiny", "Qwen2-VL-2B-Instruct",
// "Qwen2.5-VL-3B-Instruct", ...). The two share the decoder; their vision towers differ.
//
// No LibTorch here: the control plane and the data pipeline may read a model's config too.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_QWEN2VL_CONFIG_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_QWEN2VL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainctl::model {

// Which architecture a config describes: its `model_type` ("qwen2_vl", "qwen2_5_vl"), else its
// `architectures`, else Qwen2-VL.
enum class ModelFamily {
  kQwen2VL,   // Qwen2VLForConditionalGeneration
  kQwen25VL,  // Qwen2_5_VLForConditionalGeneration: RMSNorm/SwiGLU vision blocks, window attention
};

// HF's `vision_config`: Qwen2VLVisionConfig, or Qwen2_5_VLVisionConfig, whose keys differ (its
// `hidden_size` is the vision width, here embed_dim; its `out_hidden_size` the LLM width, here
// hidden_size). A Qwen2.5-VL key absent from the file takes HF's default, as transformers writes
// only the values that differ from them.
struct Qwen2VLVisionConfig {
  ModelFamily family = ModelFamily::kQwen2VL;
  int64_t depth = 32;
  int64_t embed_dim = 1280;
  int64_t num_heads = 16;
  double mlp_ratio = 4.0;         // Qwen2-VL: the MLP width is embed_dim * mlp_ratio
  int64_t intermediate_size = 0;  // Qwen2.5-VL: the SwiGLU MLP width
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t hidden_size = 3584;  // the LLM width the patch merger projects into
  int64_t in_channels = 3;
  std::string hidden_act = "quick_gelu";
  // Qwen2.5-VL: attention within windows of window_size pixels a side, except in the blocks listed
  // in fullatt_block_indexes, which attend over whole frames.
  int64_t window_size = 0;
  std::vector<int64_t> fullatt_block_indexes;
  // Qwen2.5-VL: temporal positions per second of video; kept for the saved config (no video input).
  int64_t tokens_per_second = 0;

  bool windowed() const { return family == ModelFamily::kQwen25VL; }
  int64_t head_dim() const { return embed_dim / num_heads; }
  int64_t mlp_hidden_dim() const {
    return windowed() ? intermediate_size : static_cast<int64_t>(embed_dim * mlp_ratio);
  }
  // A window's side in merged patches (HF's vit_merger_window_size).
  int64_t merged_window() const { return window_size / spatial_merge_size / patch_size; }
  // Whether block `index` attends over whole frames (every block of Qwen2-VL).
  bool FullAttentionBlock(int64_t index) const;
  // Width of one flattened patch: in_channels x temporal_patch_size x patch_size x patch_size.
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
};

struct Qwen2VLConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000.0;
  std::vector<int64_t> mrope_section;  // t/h/w split of head_dim / 2
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  // > 0: HF's *ForSequenceClassification layout, a bias-free `score` Linear [num_labels, hidden]
  // in place of lm_head (a reward model has 1). Read from a config.json whose architectures name
  // a *ForSequenceClassification class: len(id2label), else num_labels, else HF's default 2.
  // 0: the causal LM head.
  int64_t num_labels = 0;
  int64_t max_position_embeddings = 32768;
  std::string hidden_act = "silu";

  int64_t image_token_id = 151655;         // <|image_pad|>
  int64_t video_token_id = 151656;         // <|video_pad|>
  int64_t vision_start_token_id = 151652;  // <|vision_start|>
  int64_t vision_end_token_id = 151653;    // <|vision_end|>

  Qwen2VLVisionConfig vision;

  std::string torch_dtype;  // as written in the file ("bfloat16", ...); empty when absent
  std::string source;       // the file it was read from, for error messages
  std::string raw_json;     // the file's text, so a save keeps keys this struct does not model

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  ModelFamily family() const { return vision.family; }
};

// Parses HF config.json text; `source` names it in errors. INVALID_ARGUMENT naming the key and
// `source` when a required key is missing, has the wrong type, or the values are inconsistent
// (heads not dividing the width, mrope_section not summing to head_dim / 2, an activation this
// implementation does not have, a window_size that is no multiple of patch_size x
// spatial_merge_size, a fullatt_block_indexes entry outside the blocks, ...), or a model_type
// other than qwen2_vl and qwen2_5_vl.
absl::StatusOr<Qwen2VLConfig> ParseQwen2VLConfig(const std::string& json_text,
                                                 const std::string& source);

// Reads `path`: a config.json, or a directory holding one. NOT_FOUND when it cannot be read;
// otherwise as ParseQwen2VLConfig.
absl::StatusOr<Qwen2VLConfig> LoadQwen2VLConfig(const std::string& path);

// The config as HF config.json text in the published flat layout (architectures, model_type,
// text fields at the top, vision_config, rope_scaling) of its family, so transformers loads it as
// the same class, keeping any other keys of raw_json.
std::string Qwen2VLConfigToJson(const Qwen2VLConfig& config);

// The directory holding the named configs that this build knows: the source tree's configs/models.
std::string ModelRegistryDir();

// Resolves a model reference to the path of its config.json: a config.json file, a directory
// holding one, or a registry name ("tiny", "Qwen2-VL-2B-Instruct"; a leading "Qwen/" is ignored)
// looked up in `registry` (ModelRegistryDir() when empty; a rank's TRAINCTL_MODEL_REGISTRY).
// NOT_FOUND listing what was tried.
absl::StatusOr<std::string> FindModelConfig(const std::string& name_or_dir,
                                            const std::string& registry = "");

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_QWEN2VL_CONFIG_H_
