// The Qwen2-VL vision tower: Conv3d patch embedding over flattened [N, C*T*P*P] patches, ViT
// blocks with 2-D rotary embeddings and attention restricted to each frame of each image, and the
// 2x2 patch merger into the LLM width. Names are HF's (`patch_embed.proj`, `blocks.N.attn.qkv`,
// `merger.mlp.0`, ...).
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

namespace trainctl::model {

// Where the vision tower's attention may look, derived once per forward from image_grid_thw.
struct VisionLayout {
  torch::Tensor rotary_freqs;     // [N, head_dim / 2] float32: h frequencies then w frequencies
  std::vector<int64_t> segments;  // cu_seqlens: frame k owns patches [segments[k], segments[k+1])
};

// Checks `grid_thw` ([n, 3] integers, h and w divisible by spatial_merge_size) against the number
// of patches and builds the layout. Throws c10::Error with the offending image on a mismatch.
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
  torch::Tensor forward(const torch::Tensor& x, const VisionLayout& layout);

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

class Qwen2VLVisionBlock : public torch::nn::Module {
 public:
  explicit Qwen2VLVisionBlock(const Qwen2VLVisionConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const VisionLayout& layout);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  std::shared_ptr<VisionAttention> attn;
  std::shared_ptr<VisionMlp> mlp;
};

// LayerNorm, then each window of spatial_merge_size^2 consecutive patches concatenated and
// projected: Linear(4E, 4E), GELU, Linear(4E, hidden_size).
class PatchMerger : public torch::nn::Module {
 public:
  explicit PatchMerger(const Qwen2VLVisionConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_q{nullptr};
  torch::nn::Sequential mlp{nullptr};

 private:
  int64_t merged_dim_;
};

// HF's `visual` (Qwen2VisionTransformerPretrainedModel).
class Qwen2VisionTransformer : public torch::nn::Module {
 public:
  // `built`: as Qwen2VLTextModel's, with "patch_embed", "blocks.N" and "merger".
  using ModuleBuilt = std::function<void(const std::string& name, torch::nn::Module& module)>;
  explicit Qwen2VisionTransformer(const Qwen2VLVisionConfig& config,
                                  const ModuleBuilt& built = nullptr);
  // pixel_values [N, patch_dim], grid_thw [n, 3] -> [N / merge^2, hidden_size]. The plain
  // forward; the top-level model runs the same pieces one by one (units, checkpointing).
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
