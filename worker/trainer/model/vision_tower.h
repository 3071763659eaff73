// The vision towers of Qwen2-VL and Qwen2.5-VL: Conv3d patch embedding over flattened
// [N, C*T*P*P] patches, ViT blocks with 2-D rotary embeddings and attention restricted to each
// frame of each image, and the 2x2 patch merger into the LLM width. Names are HF's
// (`patch_embed.proj`, `blocks.N.attn.qkv`, `merger.mlp.0`, ...).
//
// Qwen2-VL: LayerNorms, a QuickGELU MLP (`mlp.fc1`, `mlp.fc2`). Qwen2.5-VL: RMSNorms, a SwiGLU MLP
// with biases (`mlp.gate_proj`, `mlp.up_proj`, `mlp.down_proj`), and window attention: the patches
// run through the blocks in window order (vision_window.h), every block but those of
// fullatt_block_indexes attending within its window, and the merger's output returns to the
// processor's order.
//
// Patches arrive in the order HF's Qwen2VLImageProcessor emits them: per image and frame, rows of
// merge windows, each window's spatial_merge_size^2 patches consecutive. Positions for the rotary
// embedding follow that order.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_VISION_TOWER_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_VISION_TOWER_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/text_decoder.h"

namespace trainctl::model {

// Where the vision tower's attention may look, derived once per forward from image_grid_thw. Rows
// are in the order the blocks see the patches: the processor's, or Qwen2.5-VL's window order.
struct VisionLayout {
  torch::Tensor rotary_freqs;     // [N, head_dim / 2] float32: h frequencies then w frequencies
  std::vector<int64_t> segments;  // cu_seqlens: frame k owns patches [segments[k], segments[k+1])
  // Qwen2.5-VL only (empty / undefined otherwise): cu_window_seqlens, the windows as segments;
  // the window order (VisionWindows::index) and back (inverse), int64 on the layout's device.
  std::vector<int64_t> window_segments;
  torch::Tensor window_index;
  torch::Tensor window_inverse;
};

// Checks `grid_thw` ([n, 3] integers, h and w divisible by spatial_merge_size) against the number
// of patches and builds the layout (with the windows for a Qwen2.5-VL config). Throws c10::Error
// with the offending image on a mismatch.
VisionLayout MakeVisionLayout(const Qwen2VLVisionConfig& config, const torch::Tensor& grid_thw,
                              int64_t num_patches, const torch::Device& device);

class VisionPatchEmbed : public torch::nn::Module {
 public:
  explicit VisionPatchEmbed(const Qwen2VLVisionConfig& config);
  // [N, patch_dim] -> [N, embed_dim].
  torch::Tensor forward(const torch::Tensor& patches);

  torch::nn::Conv3d proj{nullptr};

 private:
  int64_t embed_dim_;
  int64_t patch_dim_;
};

class VisionAttention : public torch::nn::Module {
 public:
  VisionAttention(int64_t dim, int64_t num_heads);
  // `x` [N, dim] with rotary angles `rotary_freqs` [N, head_dim / 2]; segment k of `segments`
  // (cu_seqlens) attends only to itself.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& rotary_freqs,
                        const std::vector<int64_t>& segments);

  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  AttentionImpl attention = AttentionImpl::kAuto;

 private:
  int64_t num_heads_;
  int64_t head_dim_;
};

// fc2(quick_gelu(fc1(x))).
class VisionMlp : public torch::nn::Module {
 public:
  VisionMlp(int64_t dim, int64_t hidden_dim);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Qwen2.5-VL's: down_proj(act(gate_proj(x)) * up_proj(x)), every Linear with a bias; act is
// vision_config.hidden_act.
class VisionSwiGluMlp : public torch::nn::Module {
 public:
  VisionSwiGluMlp(int64_t dim, int64_t hidden_dim, const std::string& act);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  std::string act_;
};

// One block; `index` is its number, which decides (Qwen2.5-VL) whether it attends over windows or
// whole frames. Of each pair of members below, the one of the config's family is set and
// registered under HF's name (norm1, norm2, mlp); the other is null.
class Qwen2VLVisionBlock : public torch::nn::Module {
 public:
  Qwen2VLVisionBlock(const Qwen2VLVisionConfig& config, int64_t index);
  torch::Tensor forward(const torch::Tensor& x, const VisionLayout& layout);

  bool full_attention() const { return full_attention_; }

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};  // Qwen2-VL
  std::shared_ptr<Qwen2RMSNorm> rms_norm1, rms_norm2;   // Qwen2.5-VL
  std::shared_ptr<VisionAttention> attn;
  std::shared_ptr<VisionMlp> mlp;               // Qwen2-VL
  std::shared_ptr<VisionSwiGluMlp> swiglu_mlp;  // Qwen2.5-VL

 private:
  bool full_attention_;
};

// LayerNorm (Qwen2.5-VL: RMSNorm), then each window of spatial_merge_size^2 consecutive patches
// concatenated and projected: Linear(4E, 4E), GELU, Linear(4E, hidden_size).
class PatchMerger : public torch::nn::Module {
 public:
  explicit PatchMerger(const Qwen2VLVisionConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_q{nullptr};      // Qwen2-VL
  std::shared_ptr<Qwen2RMSNorm> rms_ln_q;  // Qwen2.5-VL, registered as ln_q
  torch::nn::Sequential mlp{nullptr};

 private:
  int64_t merged_dim_;
};

// HF's `visual` (Qwen2VisionTransformerPretrainedModel, Qwen2_5_VisionTransformerPretrainedModel).
class Qwen2VisionTransformer : public torch::nn::Module {
 public:
  // `built`: as Qwen2VLTextModel's, with "patch_embed", "blocks.N" and "merger".
  using ModuleBuilt = std::function<void(const std::string& name, torch::nn::Module& module)>;
  explicit Qwen2VisionTransformer(const Qwen2VLVisionConfig& config,
                                  const ModuleBuilt& built = nullptr);
  // pixel_values [N, patch_dim], grid_thw [n, 3] -> [N / merge^2, hidden_size], in the
  // processor's order. The plain forward; the top-level model runs the same pieces one by one
  // (units, checkpointing).
  torch::Tensor forward(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw);

  const Qwen2VLVisionConfig& config() const { return config_; }

  std::shared_ptr<VisionPatchEmbed> patch_embed;
  torch::nn::ModuleList blocks{nullptr};
  std::vector<std::shared_ptr<Qwen2VLVisionBlock>> block_list;  // the same blocks, typed
  std::shared_ptr<PatchMerger> merger;

 private:
  Qwen2VLVisionConfig config_;
};

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_VISION_TOWER_H_
