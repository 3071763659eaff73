#include "worker/trainer/model/text_decoder.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "worker/trainer/model/fused_ops.h"
#include "worker/trainer/model/sequence_parallel.h"

namespace trainctl::model {

RotaryTables MultimodalRotary(const Qwen2VLConfig& config, const torch::Tensor& position_ids,
                              torch::ScalarType dtype) {
  const int64_t head_dim = config.head_dim();
  const auto float_opts =
      torch::TensorOptions().dtype(torch::kFloat32).device(position_ids.device());
  const torch::Tensor exponents =
      torch::arange(0, head_dim, 2, float_opts.dtype(torch::kInt64)).to(torch::kFloat32) /
      static_cast<double>(head_dim);
  const torch::Tensor inv_freq = torch::pow(config.rope_theta, exponents).reciprocal();

  // [3, B, T, head_dim / 2], then both halves.
  const torch::Tensor freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq;
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  const torch::Tensor cos = emb.cos();
  const torch::Tensor sin = emb.sin();

  std::vector<int64_t> sections = config.mrope_section;
  sections.insert(sections.end(), config.mrope_section.begin(), config.mrope_section.end());
  const auto cos_chunks = cos.split_with_sizes(sections, -1);
  const auto sin_chunks = sin.split_with_sizes(sections, -1);
  std::vector<torch::Tensor> cos_parts, sin_parts;
  for (size_t i = 0; i < sections.size(); ++i) {
    cos_parts.push_back(cos_chunks[i][static_cast<int64_t>(i % 3)]);
    sin_parts.push_back(sin_chunks[i][static_cast<int64_t>(i % 3)]);
  }
  return {torch::cat(cos_parts, -1).to(dtype), torch::cat(sin_parts, -1).to(dtype)};
}

torch::Tensor CausalPaddingMask(const torch::Tensor& attention_mask, int64_t batch, int64_t seq,
                                const torch::Device& device) {
  const torch::Tensor idx = torch::arange(seq, torch::TensorOptions().device(device));
  torch::Tensor allowed = (idx.unsqueeze(0) <= idx.unsqueeze(1)).view({1, 1, seq, seq});
  allowed = allowed.expand({batch, 1, seq, seq});
  if (attention_mask.defined()) {
    allowed = allowed.logical_and(attention_mask.to(device).ne(0).view({batch, 1, 1, seq}));
  }
  return allowed;
}

std::pair<torch::Tensor, torch::Tensor> LayerKvCache::Append(const torch::Tensor& k,
                                                             const torch::Tensor& v) {
  if (write_at.defined()) {
    key.index_copy_(2, write_at, k);
    value.index_copy_(2, write_at, v);
    return {key, value};
  }
  const int64_t t = k.size(2);
  const int64_t needed = length + t;
  if (!key.defined()) {
    std::vector<int64_t> shape = k.sizes().vec();
    shape[2] = 0;
    key = torch::zeros(shape, k.options());
    value = torch::zeros(shape, v.options());
    Grow(std::max(needed, capacity));
  } else if (needed > key.size(2)) {
    Grow(std::max(needed, 2 * key.size(2)));
  }
  key.narrow(2, length, t).copy_(k);
  value.narrow(2, length, t).copy_(v);
  length = needed;
  return {key.narrow(2, 0, length), value.narrow(2, 0, length)};
}

void LayerKvCache::Grow(int64_t room) {
  // Zeros: a fixed-shape step attends over the whole buffer, masked positions included, and a
  // masked NaN would still poison the weighted sum.
  auto grow = [room](torch::Tensor& t) {
    std::vector<int64_t> shape = t.sizes().vec();
    shape[2] = std::max(room, t.size(2));
    torch::Tensor bigger = torch::zeros(shape, t.options());
    bigger.narrow(2, 0, t.size(2)).copy_(t);
    t = std::move(bigger);
  };
  grow(key);
  grow(value);
  capacity = key.size(2);
}

Qwen2RMSNorm::Qwen2RMSNorm(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor Qwen2RMSNorm::forward(const torch::Tensor& x) { return RmsNorm(x, weight, eps_); }

Qwen2VLAttention::Qwen2VLAttention(const Qwen2VLConfig& config)
    : num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim()) {
  const int64_t hidden = config.hidden_size;
  q_proj = register_module(
      "q_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, num_heads_ * head_dim_)));
  k_proj = register_module(
      "k_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, num_kv_heads_ * head_dim_)));
  v_proj = register_module(
      "v_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, num_kv_heads_ * head_dim_)));
  o_proj = register_module(
      "o_proj",
      torch::nn::Linear(torch::nn::LinearOptions(num_heads_ * head_dim_, hidden).bias(false)));
}

void Qwen2VLAttention::SetTensorParallel(std::shared_ptr<const TensorParallel> tp) {
  const bool split = tp != nullptr && tp->size > 1 && tp->attention;
  const int64_t size = split ? tp->size : 1;
  TORCH_CHECK(num_heads_ % size == 0 && num_kv_heads_ % size == 0,
              "tensor parallelism: ", num_heads_, " attention heads and ", num_kv_heads_,
              " key/value heads do not divide among ", size, " ranks");
  tensor_parallel_ = split ? std::move(tp) : nullptr;
}

torch::Tensor Qwen2VLAttention::forward(const torch::Tensor& input, const RotaryTables& rope,
                                        const AttentionMask& mask, LayerKvCache* cache) {
  // Split heads: f before the projections, g after o_proj (tensor_parallel.h).
  const torch::Tensor x = tensor_parallel_ ? CopyToTensorParallel(input, *tensor_parallel_) : input;
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t parts = tensor_parallel_ ? tensor_parallel_->size : 1;
  const int64_t heads = num_heads_ / parts, kv_heads = num_kv_heads_ / parts;
  torch::Tensor q = q_proj->forward(x).view({batch, seq, heads, head_dim_}).transpose(1, 2);
  torch::Tensor k = k_proj->forward(x).view({batch, seq, kv_heads, head_dim_}).transpose(1, 2);
  torch::Tensor v = v_proj->forward(x).view({batch, seq, kv_heads, head_dim_}).transpose(1, 2);

  std::tie(q, k) = ApplyRotary(q, k, rope.cos, rope.sin);

  torch::Tensor out;
  if (mask.sequence) {
    TORCH_CHECK(cache == nullptr && !mask.packed,
                "sequence parallelism takes neither a KV cache nor packed rows");
    out = UlyssesAttention(attention, q, k, v, mask.allowed, *mask.sequence);
  } else if (mask.packed) {
    TORCH_CHECK(cache == nullptr, "packed rows take no KV cache");
    out = PackedCausalAttention(attention, q, k, v, *mask.packed);
  } else {
    if (cache != nullptr) {
      TORCH_CHECK(mask.allowed.defined() || cache->length == 0,
                  "attention over a non-empty KV cache needs an explicit mask");
      std::tie(k, v) = cache->Append(k, v);
    }
    out = DotProductAttention(attention, q, k, v, mask.allowed, /*causal=*/true);
  }
  out = out.transpose(1, 2).reshape({batch, seq, heads * head_dim_});
  out = o_proj->forward(out);
  return tensor_parallel_ ? ReduceFromTensorParallel(out, *tensor_parallel_) : out;
}

Qwen2MLP::Qwen2MLP(const Qwen2VLConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t inner = config.intermediate_size;
  gate_proj = register_module(
      "gate_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, inner).bias(false)));
  up_proj = register_module("up_proj",
                            torch::nn::Linear(torch::nn::LinearOptions(hidden, inner).bias(false)));
  down_proj = register_module(
      "down_proj", torch::nn::Linear(torch::nn::LinearOptions(inner, hidden).bias(false)));
}

torch::Tensor Qwen2MLP::forward(const torch::Tensor& x) {
  if (tensor_parallel == nullptr || tensor_parallel->size <= 1) {
    return down_proj->forward(SwiGlu(gate_proj->forward(x), up_proj->forward(x)));
  }
  const torch::Tensor in = CopyToTensorParallel(x, *tensor_parallel);
  const torch::Tensor part =
      down_proj->forward(SwiGlu(gate_proj->forward(in), up_proj->forward(in)));
  return ReduceFromTensorParallel(part, *tensor_parallel);
}

Qwen2VLDecoderLayer::Qwen2VLDecoderLayer(const Qwen2VLConfig& config) {
  self_attn = register_module("self_attn", std::make_shared<Qwen2VLAttention>(config));
  mlp = register_module("mlp", std::make_shared<Qwen2MLP>(config));
  input_layernorm = register_module(
      "input_layernorm", std::make_shared<Qwen2RMSNorm>(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm",
                      std::make_shared<Qwen2RMSNorm>(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor Qwen2VLDecoderLayer::forward(const torch::Tensor& x, const RotaryTables& rope,
                                           const AttentionMask& mask, LayerKvCache* cache) {
  const torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x), rope, mask, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Qwen2VLTextModel::Qwen2VLTextModel(const Qwen2VLConfig& config, const ModuleBuilt& built) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(torch::nn::EmbeddingOptions(
                                                     config.vocab_size, config.hidden_size)));
  if (built) built("embed_tokens", *embed_tokens);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    auto layer = std::make_shared<Qwen2VLDecoderLayer>(config);
    layers->push_back(layer);
    if (built) built("layers." + std::to_string(i), *layer);
    layer_list.push_back(std::move(layer));
  }
  norm = register_module("norm",
                         std::make_shared<Qwen2RMSNorm>(config.hidden_size, config.rms_norm_eps));
  if (built) built("norm", *norm);
}

}  // namespace trainctl::model
