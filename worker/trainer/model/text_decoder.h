// The Qwen2 decoder of Qwen2-VL: RMSNorm, GQA attention with multimodal RoPE, SwiGLU MLP.
// Module and parameter names are HF's (`self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`,
// ...), so a state dict maps one to one onto a checkpoint.
//
// Single-device code: nothing here knows of sharding or recomputation; the top-level model drives
// the layers one by one (see qwen2vl.h).
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_TEXT_DECODER_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_TEXT_DECODER_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/trainer/model/attention.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/tensor_parallel.h"

namespace trainctl::model {

// cos and sin of the multimodal rotary embedding, [B, T, head_dim] each, in the model's dtype.
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
};

// Builds the rotary tables for `position_ids` [3, B, T] (t, h, w): per-axis frequencies
// theta^(-2i/head_dim), then channel chunks taken from the t, h and w rows by mrope_section
// (repeated for both halves of head_dim), as HF's apply_multimodal_rotary_pos_emb.
RotaryTables MultimodalRotary(const Qwen2VLConfig& config, const torch::Tensor& position_ids,
                              torch::ScalarType dtype);

// The keys and values one decoder layer has seen, for incremental decoding: buffers
// [B, Hkv, capacity, D] whose first `length` positions hold the tokens so far. Keys are stored
// after rotary embedding, so a cached key never needs its position again.
struct LayerKvCache {
  torch::Tensor key;
  torch::Tensor value;
  int64_t length = 0;
  int64_t capacity = 0;  // positions the first Append allocates room for (at least its own)
  // Set for a fixed-shape decoding step (DecodeStepAt): [1] int64 on the device, where Append
  // writes its one position; it then returns the whole buffers.
  torch::Tensor write_at;

  // Writes k, v [B, Hkv, t, D] at positions [length, length + t) and returns views of every
  // cached key and value [B, Hkv, length + t, D]. Past the capacity the buffers are regrown
  // (copied to twice the size); positions past those written hold zeros. With write_at: writes
  // k, v (t = 1) at that position and returns the buffers [B, Hkv, capacity, D] whole.
  std::pair<torch::Tensor, torch::Tensor> Append(const torch::Tensor& k, const torch::Tensor& v);
  // Room for `room` positions (at least the present ones): the buffers reallocated, zero past the
  // positions written, the written ones copied. Appended positions keep their place.
  void Grow(int64_t room);
};

// x * rsqrt(mean(x^2) + eps) * weight, computed in float32.
class Qwen2RMSNorm : public torch::nn::Module {
 public:
  Qwen2RMSNorm(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;

 private:
  double eps_;
};

class Qwen2VLAttention : public torch::nn::Module {
 public:
  explicit Qwen2VLAttention(const Qwen2VLConfig& config);
  // `x` [B, T, hidden]; `mask.allowed` bool [B, 1, T, T] (true where query may attend to key),
  // a key mask [B, 1, 1, T] narrowed causally, or undefined for plain causal attention (no
  // padding); or `mask.packed`, the samples of packed rows, each attended causally on its own.
  //
  // With `cache`, the new keys and values are appended to it and the queries read every cached
  // position: `mask.allowed` is then [B, 1, T or 1, cache length + T], and may be undefined only
  // while the cache is empty (causal over the T new tokens). Packed rows take no cache.
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope, const AttentionMask& mask,
                        LayerKvCache* cache = nullptr);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  AttentionImpl attention = AttentionImpl::kAuto;

  // Null or size 1: the whole attention. Else, with tp->attention, the projections hold this
  // rank's heads (tensor_parallel.h; their head counts must divide by tp->size) and the output's
  // parts are summed over the group; without it the attention stays whole.
  void SetTensorParallel(std::shared_ptr<const TensorParallel> tp);

 private:
  int64_t num_heads_;     // the whole model's; a rank with split heads holds 1/tp of them
  int64_t num_kv_heads_;  // likewise
  int64_t head_dim_;
  std::shared_ptr<const TensorParallel> tensor_parallel_;  // set when the heads are split
};

// down_proj(silu(gate_proj(x)) * up_proj(x)).
class Qwen2MLP : public torch::nn::Module {
 public:
  explicit Qwen2MLP(const Qwen2VLConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  // Set (size > 1) when the weights are this rank's slices (tensor_parallel.h): the parts are
  // summed over the group.
  std::shared_ptr<const TensorParallel> tensor_parallel;
};

class Qwen2VLDecoderLayer : public torch::nn::Module {
 public:
  explicit Qwen2VLDecoderLayer(const Qwen2VLConfig& config);
  // As Qwen2VLAttention::forward, `cache` included.
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope, const AttentionMask& mask,
                        LayerKvCache* cache = nullptr);

  std::shared_ptr<Qwen2VLAttention> self_attn;
  std::shared_ptr<Qwen2MLP> mlp;
  std::shared_ptr<Qwen2RMSNorm> input_layernorm;
  std::shared_ptr<Qwen2RMSNorm> post_attention_layernorm;
};

// HF's `model` (Qwen2VLModel): embeddings, layers, final norm. The top-level model runs them.
class Qwen2VLTextModel : public torch::nn::Module {
 public:
  // `built`, when set, is called with each unit-sized child ("embed_tokens", "layers.N",
  // "norm") right after it is constructed, before the next one is: a sharding engine takes the
  // child's weights and frees them, so the whole model never exists at once.
  using ModuleBuilt = std::function<void(const std::string& name, torch::nn::Module& module)>;
  explicit Qwen2VLTextModel(const Qwen2VLConfig& config, const ModuleBuilt& built = nullptr);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<std::shared_ptr<Qwen2VLDecoderLayer>> layer_list;  // the same layers, typed
  std::shared_ptr<Qwen2RMSNorm> norm;
};

// Bool [B, 1, T, T]: key j visible to query i when j <= i and key j is not padding
// (`attention_mask` [B, T], 1 = token; undefined = no padding).
torch::Tensor CausalPaddingMask(const torch::Tensor& attention_mask, int64_t batch, int64_t seq,
                                const torch::Device& device);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_TEXT_DECODER_H_
