#include "worker/trainer/model/vision_tower.h"

#include <algorithm>

#include "worker/trainer/model/fused_ops.h"
#include "worker/trainer/model/vision_window.h"

namespace trainctl::model {
namespace {

using torch::indexing::Slice;

constexpr double kVisionRopeTheta = 10000.0;
constexpr double kVisionNormEps = 1e-6;

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat(
      {-x.index({"...", Slice(half, torch::indexing::None)}), x.index({"...", Slice(0, half)})},
      -1);
}

// Rotates `x` [N, heads, head_dim] by the per-patch angles `freqs` [N, head_dim / 2], in float32
// as HF does, returning x's dtype.
torch::Tensor ApplyVisionRotary(const torch::Tensor& x, const torch::Tensor& freqs) {
  const torch::Tensor angles = torch::cat({freqs, freqs}, -1).unsqueeze(1);  // [N, 1, head_dim]
  const torch::Tensor xf = x.to(torch::kFloat32);
  return (xf * angles.cos() + RotateHalf(xf) * angles.sin()).to(x.scalar_type());
}

torch::Tensor QuickGelu(const torch::Tensor& x) { return x * torch::sigmoid(1.702 * x); }

// HF's ACT2FN for the activations a vision config may name (checked by the config parser).
torch::Tensor VisionActivation(const std::string& name, const torch::Tensor& x) {
  if (name == "silu") return torch::silu(x);
  if (name == "gelu") return torch::gelu(x);
  if (name == "gelu_pytorch_tanh") return torch::gelu(x, "tanh");
  TORCH_CHECK(name == "quick_gelu", "vision activation \"", name,
              "\" passed the config parser, which allows only these four");
  return QuickGelu(x);
}

// Qwen2.5-VL's windows: the rotary angles moved into window order, the windows as segments.
void AddWindows(const Qwen2VLVisionConfig& config, const torch::Tensor& grid_thw,
                const torch::Device& device, VisionLayout& layout) {
  const VisionWindows windows = GetWindowIndex(config, grid_thw);
  const int64_t unit = config.spatial_merge_size * config.spatial_merge_size;
  layout.window_index = windows.index.to(device);
  layout.window_inverse = windows.inverse.to(device);
  layout.rotary_freqs = ToWindowOrder(layout.rotary_freqs, layout.window_index, unit);
  layout.window_segments = windows.cu_seqlens;
}

// LayerNorm computed in float32 and returned in x's dtype. Under CUDA autocast this gives what
// HF gets (layer_norm runs in float32 there and the Linear after it casts down anyway); LibTorch
// 1.13's CPU kernel cannot mix a bf16 input with float32 weights at all.
torch::Tensor NormInFloat32(const torch::nn::LayerNorm& norm, const torch::Tensor& x) {
  const auto& options = norm->options;
  return torch::layer_norm(x.to(torch::kFloat32), options.normalized_shape(),
                           norm->weight.to(torch::kFloat32), norm->bias.to(torch::kFloat32),
                           options.eps())
      .to(x.scalar_type());
}

}  // namespace

VisionLayout MakeVisionLayout(const Qwen2VLVisionConfig& config, const torch::Tensor& grid_thw,
                              int64_t num_patches, const torch::Device& device) {
  TORCH_CHECK(grid_thw.defined() && grid_thw.dim() == 2 && grid_thw.size(1) == 3,
              "image_grid_thw must be [num_images, 3], got ",
              grid_thw.defined() ? grid_thw.sizes() : torch::IntArrayRef{});
  const torch::Tensor grid = grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const auto g = grid.accessor<int64_t, 2>();
  const int64_t m = config.spatial_merge_size;

  std::vector<int64_t> h_pos, w_pos;
  VisionLayout layout;
  layout.segments.push_back(0);
  int64_t max_side = 0;
  for (int64_t i = 0; i < grid.size(0); ++i) {
    const int64_t t = g[i][0], h = g[i][1], w = g[i][2];
    TORCH_CHECK(t > 0 && h > 0 && w > 0, "image ", i, ": grid (", t, ", ", h, ", ", w,
                ") must be positive");
    TORCH_CHECK(h % m == 0 && w % m == 0, "image ", i, ": grid h ", h, " and w ", w,
                " must be multiples of spatial_merge_size ", m);
    for (int64_t frame = 0; frame < t; ++frame) {
      for (int64_t bh = 0; bh < h / m; ++bh) {
        for (int64_t bw = 0; bw < w / m; ++bw) {
          for (int64_t ih = 0; ih < m; ++ih) {
            for (int64_t iw = 0; iw < m; ++iw) {
              h_pos.push_back(bh * m + ih);
              w_pos.push_back(bw * m + iw);
            }
          }
        }
      }
      layout.segments.push_back(layout.segments.back() + h * w);
    }
    max_side = std::max({max_side, h, w});
  }
  TORCH_CHECK(layout.segments.back() == num_patches, "pixel_values holds ", num_patches,
              " patches but image_grid_thw describes ", layout.segments.back());

  const int64_t dim = config.head_dim() / 2;
  const torch::Tensor inv_freq =
      torch::pow(kVisionRopeTheta,
                 torch::arange(0, dim, 2, torch::kFloat32) / static_cast<double>(dim))
          .reciprocal();
  const torch::Tensor table = torch::outer(torch::arange(max_side, torch::kFloat32), inv_freq);
  const auto long_opts = torch::TensorOptions().dtype(torch::kInt64);
  const torch::Tensor hp = torch::tensor(h_pos, long_opts);
  const torch::Tensor wp = torch::tensor(w_pos, long_opts);
  layout.rotary_freqs =
      torch::cat({table.index_select(0, hp), table.index_select(0, wp)}, -1).to(device);
  if (config.windowed()) AddWindows(config, grid, device, layout);
  return layout;
}

VisionPatchEmbed::VisionPatchEmbed(const Qwen2VLVisionConfig& config)
    : embed_dim_(config.embed_dim), patch_dim_(config.patch_dim()) {
  const int64_t p = config.patch_size;
  proj = register_module(
      "proj", torch::nn::Conv3d(torch::nn::Conv3dOptions(config.in_channels, config.embed_dim,
                                                         {config.temporal_patch_size, p, p})
                                    .stride({config.temporal_patch_size, p, p})
                                    .bias(false)));
}

torch::Tensor VisionPatchEmbed::forward(const torch::Tensor& patches) {
  // A stride-equals-kernel Conv3d over one patch is a dot product with the flattened kernel.
  const torch::Tensor& w = proj->weight;
  return torch::linear(patches.reshape({-1, patch_dim_}).to(w.scalar_type()),
                       w.view({embed_dim_, patch_dim_}));
}

VisionAttention::VisionAttention(int64_t dim, int64_t num_heads)
    : num_heads_(num_heads), head_dim_(dim / num_heads) {
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(dim, dim)));
}

torch::Tensor VisionAttention::forward(const torch::Tensor& x, const torch::Tensor& rotary_freqs,
                                       const std::vector<int64_t>& segments) {
  const int64_t n = x.size(0);
  const torch::Tensor packed =
      qkv->forward(x).view({n, 3, num_heads_, head_dim_}).permute({1, 0, 2, 3});
  const torch::Tensor q = ApplyVisionRotary(packed[0], rotary_freqs);
  const torch::Tensor k = ApplyVisionRotary(packed[1], rotary_freqs);
  const torch::Tensor v = packed[2];

  // Each frame (or window) attends only to itself: run the segments separately instead of masking
  // one [N, N] matrix.
  std::vector<torch::Tensor> outs;
  outs.reserve(segments.size() - 1);
  for (size_t s = 0; s + 1 < segments.size(); ++s) {
    const Slice rows(segments[s], segments[s + 1]);
    auto heads_first = [&rows](const torch::Tensor& t) {  // [1, heads, L, head_dim]
      return t.index({rows}).transpose(0, 1).unsqueeze(0);
    };
    const torch::Tensor out = DotProductAttention(attention, heads_first(q), heads_first(k),
                                                  heads_first(v), {}, /*causal=*/false);
    outs.push_back(out.squeeze(0).transpose(0, 1));  // [L, heads, head_dim]
  }
  return proj->forward(torch::cat(outs, 0).reshape({n, num_heads_ * head_dim_}));
}

VisionMlp::VisionMlp(int64_t dim, int64_t hidden_dim) {
  fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(dim, hidden_dim)));
  fc2 = register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(hidden_dim, dim)));
}

torch::Tensor VisionMlp::forward(const torch::Tensor& x) {
  return fc2->forward(QuickGelu(fc1->forward(x)));
}

VisionSwiGluMlp::VisionSwiGluMlp(int64_t dim, int64_t hidden_dim, const std::string& act)
    : act_(act) {
  gate_proj =
      register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(dim, hidden_dim)));
  up_proj =
      register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(dim, hidden_dim)));
  down_proj =
      register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden_dim, dim)));
}

torch::Tensor VisionSwiGluMlp::forward(const torch::Tensor& x) {
  const torch::Tensor gate = gate_proj->forward(x);
  const torch::Tensor up = up_proj->forward(x);
  return down_proj->forward(act_ == "silu" ? SwiGlu(gate, up) : VisionActivation(act_, gate) * up);
}

Qwen2VLVisionBlock::Qwen2VLVisionBlock(const Qwen2VLVisionConfig& config, int64_t index)
    : full_attention_(config.FullAttentionBlock(index)) {
  if (config.windowed()) {
    rms_norm1 =
        register_module("norm1", std::make_shared<Qwen2RMSNorm>(config.embed_dim, kVisionNormEps));
    rms_norm2 =
        register_module("norm2", std::make_shared<Qwen2RMSNorm>(config.embed_dim, kVisionNormEps));
  } else {
    const auto norm_opts = torch::nn::LayerNormOptions({config.embed_dim}).eps(kVisionNormEps);
    norm1 = register_module("norm1", torch::nn::LayerNorm(norm_opts));
    norm2 = register_module("norm2", torch::nn::LayerNorm(norm_opts));
  }
  attn = register_module("attn",
                         std::make_shared<VisionAttention>(config.embed_dim, config.num_heads));
  if (config.windowed()) {
    swiglu_mlp =
        register_module("mlp", std::make_shared<VisionSwiGluMlp>(
                                   config.embed_dim, config.mlp_hidden_dim(), config.hidden_act));
  } else {
    mlp = register_module("mlp",
                          std::make_shared<VisionMlp>(config.embed_dim, config.mlp_hidden_dim()));
  }
}

torch::Tensor Qwen2VLVisionBlock::forward(const torch::Tensor& x, const VisionLayout& layout) {
  const std::vector<int64_t>& segments = full_attention_ ? layout.segments : layout.window_segments;
  if (swiglu_mlp) {
    const torch::Tensor h = x + attn->forward(rms_norm1->forward(x), layout.rotary_freqs, segments);
    return h + swiglu_mlp->forward(rms_norm2->forward(h));
  }
  const torch::Tensor h = x + attn->forward(NormInFloat32(norm1, x), layout.rotary_freqs, segments);
  return h + mlp->forward(NormInFloat32(norm2, h));
}

PatchMerger::PatchMerger(const Qwen2VLVisionConfig& config)
    : merged_dim_(config.embed_dim * config.spatial_merge_size * config.spatial_merge_size) {
  if (config.windowed()) {
    rms_ln_q =
        register_module("ln_q", std::make_shared<Qwen2RMSNorm>(config.embed_dim, kVisionNormEps));
  } else {
    ln_q = register_module(
        "ln_q",
        torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.embed_dim}).eps(kVisionNormEps)));
  }
  mlp = register_module(
      "mlp",
      torch::nn::Sequential(
          torch::nn::Linear(torch::nn::LinearOptions(merged_dim_, merged_dim_)), torch::nn::GELU(),
          torch::nn::Linear(torch::nn::LinearOptions(merged_dim_, config.hidden_size))));
}

torch::Tensor PatchMerger::forward(const torch::Tensor& x) {
  const torch::Tensor normed = rms_ln_q ? rms_ln_q->forward(x) : NormInFloat32(ln_q, x);
  return mlp->forward(normed.reshape({-1, merged_dim_}));
}

Qwen2VisionTransformer::Qwen2VisionTransformer(const Qwen2VLVisionConfig& config,
                                               const ModuleBuilt& built)
    : config_(config) {
  patch_embed = register_module("patch_embed", std::make_shared<VisionPatchEmbed>(config));
  if (built) built("patch_embed", *patch_embed);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) {
    auto block = std::make_shared<Qwen2VLVisionBlock>(config, i);
    blocks->push_back(block);
    if (built) built("blocks." + std::to_string(i), *block);
    block_list.push_back(std::move(block));
  }
  merger = register_module("merger", std::make_shared<PatchMerger>(config));
  if (built) built("merger", *merger);
}

torch::Tensor Qwen2VisionTransformer::forward(const torch::Tensor& pixel_values,
                                              const torch::Tensor& grid_thw) {
  torch::Tensor h = patch_embed->forward(pixel_values);
  const VisionLayout layout = MakeVisionLayout(config_, grid_thw, h.size(0), h.device());
  const int64_t unit = config_.spatial_merge_size * config_.spatial_merge_size;
  if (layout.window_index.defined()) h = ToWindowOrder(h, layout.window_index, unit);
  for (const auto& block : block_list) h = block->forward(h, layout);
  h = merger->forward(h);
  return layout.window_inverse.defined() ? FromWindowOrder(h, layout.window_inverse) : h;
}

}  // namespace trainctl::model
