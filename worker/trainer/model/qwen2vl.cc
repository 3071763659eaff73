#include "worker/trainer/model/qwen2vl.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "worker/trainer/model/internal/activation_checkpoint.h"
#include "worker/trainer/model/internal/linear_cross_entropy.h"
#include "worker/trainer/model/sequence_parallel.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/model/vision_window.h"

namespace trainctl::model {
namespace {

// The token embeddings of `ids`: the whole table, or this rank's vocabulary rows summed over the
// tensor-parallel group (tensor_parallel.h).
torch::Tensor EmbedTokens(torch::nn::EmbeddingImpl& embed,
                          const std::shared_ptr<const TensorParallel>& tp,
                          const torch::Tensor& ids) {
  return tp ? VocabParallelEmbedding(ids, embed.weight, *tp) : embed.forward(ids);
}

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

constexpr double kInitStd = 0.02;

// normal_(0, std) drawn on the CPU (the generator is a CPU one) whatever the tensor's device.
void NormalInit(torch::Tensor& weight, double std, at::Generator& gen) {
  if (weight.device().is_cpu()) {
    weight.normal_(0.0, std, gen);
  } else {
    weight.copy_(
        torch::empty(weight.sizes(), weight.options().device(torch::kCPU)).normal_(0.0, std, gen));
  }
}

// The decoding state after a prompt of `seq` tokens with rotary `positions` [3, B, T]: the mask
// with room to grow, and each row's rope delta (largest real position + 1 - seq).
void StartCache(const torch::Tensor& attention_mask, const torch::Tensor& positions, int64_t batch,
                int64_t seq, const torch::Device& device, KvCache& cache) {
  const torch::Tensor mask =
      attention_mask.defined()
          ? attention_mask.to(device, torch::kInt64)
          : torch::ones({batch, seq}, torch::TensorOptions().device(device).dtype(torch::kInt64));
  TORCH_CHECK(mask.ne(0).any(1).all().item<bool>(), "every prompt row needs at least one token");
  const int64_t room = std::max(seq + 1, cache.layers.empty() ? seq : cache.layers[0].capacity);
  cache.attention_mask = torch::zeros({batch, room}, mask.options());
  cache.attention_mask.narrow(1, 0, seq).copy_(mask);
  // Padding holds position 1 in GetRopeIndex; leave it out of the maximum.
  const torch::Tensor real = positions.to(device).masked_fill(mask.eq(0).unsqueeze(0), -1);
  cache.rope_deltas = real.amax({0, 2}) + 1 - seq;
  cache.length = seq;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rotary position ids

namespace {

// Positions of one sequence (a row, or one sample of a packed row): `tokens` at columns `cols` of
// row b. Images take grid rows from `image_index` on, in order.
void PlaceSequence(const Qwen2VLConfig& config, const std::vector<int64_t>& tokens,
                   const std::vector<int64_t>& cols, int64_t b, const torch::Tensor& grid,
                   int64_t& image_index, torch::Tensor& out) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t merge = config.vision.spatial_merge_size;
  int64_t image_count = 0;
  for (int64_t k = 0; k + 1 < n; ++k) {
    if (tokens[k] == config.vision_start_token_id && tokens[k + 1] == config.image_token_id) {
      ++image_count;
    }
    // No video input exists here (no video_grid_thw); Qwen2.5-VL refuses a video's tokens rather
    // than placing them as text.
    TORCH_CHECK(
        config.family() != ModelFamily::kQwen25VL || tokens[k] != config.vision_start_token_id ||
            tokens[k + 1] != config.video_token_id,
        "batch row ", b, ": <|video_pad|> after <|vision_start|>: videos are not supported");
  }
  std::vector<std::array<int64_t, 3>> pos;
  pos.reserve(tokens.size());
  int64_t st = 0;
  int64_t next = 0;  // one past the largest position so far
  auto push_text = [&pos, &next](int64_t count) {
    for (int64_t k = 0; k < count; ++k) pos.push_back({next + k, next + k, next + k});
    next += count;
  };
  for (int64_t i = 0; i < image_count; ++i) {
    const auto it =
        std::find(tokens.begin() + std::min(st, n), tokens.end(), config.image_token_id);
    TORCH_CHECK(it != tokens.end(), "batch row ", b, ": no <|image_pad|> for image ", i);
    TORCH_CHECK(grid.defined() && image_index < grid.size(0), "batch row ", b,
                " holds more images than the ", grid.defined() ? grid.size(0) : 0,
                " rows of image_grid_thw");
    const auto g = grid.accessor<int64_t, 2>();
    const int64_t ed = it - tokens.begin();
    const int64_t t = g[image_index][0];
    const int64_t gh = g[image_index][1] / merge;
    const int64_t gw = g[image_index][2] / merge;
    ++image_index;
    push_text(ed - st);
    const int64_t base = next;
    // Qwen2.5-VL scales an image's frame index by its seconds per grid step, 0 for an image.
    const int64_t t_step = config.family() == ModelFamily::kQwen25VL ? 0 : 1;
    for (int64_t ti = 0; ti < t; ++ti) {
      for (int64_t hi = 0; hi < gh; ++hi) {
        for (int64_t wi = 0; wi < gw; ++wi) {
          pos.push_back({base + ti * t_step, base + hi, base + wi});
        }
      }
    }
    next = base + std::max({(t - 1) * t_step + 1, gh, gw});
    st = ed + t * gh * gw;
  }
  if (st < n) push_text(n - st);
  TORCH_CHECK(static_cast<int64_t>(pos.size()) == n, "batch row ", b,
              ": the <|image_pad|> runs do not match image_grid_thw (", pos.size(),
              " positions for ", n, " tokens)");
  auto o = out.accessor<int64_t, 3>();
  for (int64_t k = 0; k < n; ++k) {
    for (int axis = 0; axis < 3; ++axis) o[axis][b][cols[k]] = pos[k][axis];
  }
}

}  // namespace

torch::Tensor GetRopeIndex(const Qwen2VLConfig& config, const torch::Tensor& input_ids,
                           const torch::Tensor& image_grid_thw, const torch::Tensor& attention_mask,
                           const torch::Tensor& segment_ids) {
  TORCH_CHECK(input_ids.defined() && input_ids.dim() == 2, "input_ids must be [batch, seq]");
  const torch::Device device = input_ids.device();
  const torch::Tensor ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t batch = ids.size(0);
  const int64_t seq = ids.size(1);
  torch::Tensor mask;
  if (attention_mask.defined()) {
    TORCH_CHECK(attention_mask.sizes() == input_ids.sizes(), "attention_mask has shape ",
                attention_mask.sizes(), " but input_ids has ", input_ids.sizes());
    mask = attention_mask.to(torch::kCPU, torch::kInt64).contiguous();
  }
  if (segment_ids.defined()) {
    TORCH_CHECK(segment_ids.sizes() == input_ids.sizes(), "segment_ids has shape ",
                segment_ids.sizes(), " but input_ids has ", input_ids.sizes());
  }

  if (!image_grid_thw.defined() && !segment_ids.defined()) {
    torch::Tensor pos;
    if (mask.defined()) {
      pos = mask.cumsum(-1) - 1;
      pos.masked_fill_(mask.eq(0), 1);
    } else {
      pos = torch::arange(seq, torch::kInt64).view({1, seq}).expand({batch, seq});
    }
    return pos.unsqueeze(0).expand({3, batch, seq}).contiguous().to(device);
  }

  torch::Tensor grid;
  if (image_grid_thw.defined()) {
    TORCH_CHECK(image_grid_thw.dim() == 2 && image_grid_thw.size(1) == 3,
                "image_grid_thw must be [num_images, 3], got ", image_grid_thw.sizes());
    grid = image_grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  }
  // Each row's sequences: its tokens (mask 1), or with segment_ids each run of one non-zero
  // segment id, whose positions restart at 0 (a packed row's samples).
  const torch::Tensor seg = segment_ids.defined()
                                ? segment_ids.to(torch::kCPU, torch::kInt64).contiguous()
                                : (mask.defined() ? mask : torch::ones_like(ids));
  const auto id = ids.accessor<int64_t, 2>();
  const auto sg = seg.accessor<int64_t, 2>();
  torch::Tensor out = torch::ones({3, batch, seq}, torch::kInt64);
  int64_t image_index = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> cols, tokens;
    int64_t current = 0;
    for (int64_t j = 0; j <= seq; ++j) {
      const int64_t s = j < seq ? sg[b][j] : 0;
      if (j == seq || (s != 0 && s != current && current != 0)) {
        if (!cols.empty()) PlaceSequence(config, tokens, cols, b, grid, image_index, out);
        cols.clear();
        tokens.clear();
      }
      if (j < seq && s != 0) {
        current = s;
        cols.push_back(j);
        tokens.push_back(id[b][j]);
      }
    }
  }
  return out.to(device);
}

torch::Tensor ToDeviceAsync(const torch::Tensor& t, const torch::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  if (t.is_cpu() && device.is_cuda()) return t.pin_memory().to(device, /*non_blocking=*/true);
  return t.to(device);
}

torch::Tensor PackedCausalMask(const torch::Tensor& segment_ids, const torch::Device& device) {
  const torch::Tensor seg = segment_ids.to(device, torch::kInt64);
  const int64_t batch = seg.size(0), seq = seg.size(1);
  const torch::Tensor idx = torch::arange(seq, torch::TensorOptions().device(device));
  const torch::Tensor causal = (idx.unsqueeze(0) <= idx.unsqueeze(1)).view({1, seq, seq});
  const torch::Tensor same = seg.unsqueeze(2).eq(seg.unsqueeze(1));  // [B, query, key]
  const torch::Tensor token = seg.ne(0);
  // Padding attends to itself only, so no row of the softmax is empty.
  const torch::Tensor self = idx.unsqueeze(0).eq(idx.unsqueeze(1)).view({1, seq, seq});
  return ((causal & same & token.unsqueeze(1)) | (self & token.logical_not().unsqueeze(2)))
      .view({batch, 1, seq, seq});
}

// ---------------------------------------------------------------------------------------------
// Units

std::vector<std::pair<std::string, torch::Tensor>> ModelUnit::NamedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [prefix, module] : modules) {
    for (const auto& item : module->named_parameters(/*recurse=*/true)) {
      out.emplace_back(Join(prefix, item.key()), item.value());
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Model

Qwen2VLForConditionalGeneration::Qwen2VLForConditionalGeneration(const Qwen2VLConfig& config,
                                                                 const UnitBuilt& unit_built)
    : config_(config) {
  const uint64_t base_seed = DrawBaseSeed();
  using Part = std::pair<std::string, torch::nn::Module*>;
  auto finish_unit = [&](const std::string& unit, const std::vector<Part>& parts) {
    InitUnitModules(unit, parts, base_seed, kInitStd);
    if (!unit_built) return;
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (const auto& [prefix, module] : parts) {
      for (const auto& item : module->named_parameters(/*recurse=*/true)) {
        params.emplace_back(Join(prefix, item.key()), item.value());
      }
    }
    unit_built(unit, params);
  };
  // Registration order is HF's, so named_parameters() lists keys in HF's order too.
  visual = register_module(
      "visual", std::make_shared<Qwen2VisionTransformer>(
                    config.vision, [&](const std::string& name, torch::nn::Module& module) {
                      finish_unit("visual." + name, {{"visual." + name, &module}});
                    }));
  Part norm;
  const bool score_head = config.num_labels > 0;
  const bool tied_head = config.tie_word_embeddings && !score_head;
  language_model =
      register_module("model", std::make_shared<Qwen2VLTextModel>(
                                   config, [&](const std::string& name, torch::nn::Module& module) {
                                     if (name != "norm") {
                                       finish_unit("model." + name, {{"model." + name, &module}});
                                     } else {
                                       norm = {"model.norm", &module};  // the head unit starts here
                                       if (tied_head) finish_unit("head", {norm});
                                     }
                                   }));
  if (score_head) {
    score = register_module(
        "score", torch::nn::Linear(
                     torch::nn::LinearOptions(config.hidden_size, config.num_labels).bias(false)));
    finish_unit("head", {norm, {"score", score.get()}});
  } else if (!tied_head) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(
            torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
    finish_unit("head", {norm, {"lm_head", lm_head.get()}});
  }
  BuildUnits();
}

uint64_t Qwen2VLForConditionalGeneration::DrawBaseSeed() {
  return static_cast<uint64_t>(
      torch::randint(std::numeric_limits<int64_t>::max(), {1}, torch::kInt64).item<int64_t>());
}

void Qwen2VLForConditionalGeneration::InitUnitModules(
    const std::string& unit, const std::vector<std::pair<std::string, torch::nn::Module*>>& parts,
    uint64_t base_seed, double std) {
  // FNV-1a of the unit name, mixed into the base seed with SplitMix64's finaliser.
  uint64_t z = 0xcbf29ce484222325ULL;
  for (unsigned char c : unit) z = (z ^ c) * 0x100000001b3ULL;
  z += base_seed + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(z);
  torch::NoGradGuard no_grad;
  for (const auto& part : parts) {
    for (const auto& module : part.second->modules(/*include_self=*/true)) {
      if (auto* linear = module->as<torch::nn::Linear>()) {
        NormalInit(linear->weight, std, gen);
        if (linear->bias.defined()) linear->bias.zero_();
      } else if (auto* conv = module->as<torch::nn::Conv3d>()) {
        NormalInit(conv->weight, std, gen);
      } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
        NormalInit(embedding->weight, std, gen);
      } else if (auto* layer_norm = module->as<torch::nn::LayerNorm>()) {
        layer_norm->weight.fill_(1.0);
        layer_norm->bias.zero_();
      } else if (auto* rms_norm = dynamic_cast<Qwen2RMSNorm*>(module.get())) {
        rms_norm->weight.fill_(1.0);
      }
    }
  }
}

void Qwen2VLForConditionalGeneration::InitWeights(double std) {
  const uint64_t base_seed = DrawBaseSeed();
  for (const ModelUnit& unit : units_) {
    std::vector<std::pair<std::string, torch::nn::Module*>> parts;
    for (const auto& [prefix, module] : unit.modules) parts.emplace_back(prefix, module.get());
    InitUnitModules(unit.name, parts, base_seed, std);
  }
}

void Qwen2VLForConditionalGeneration::BuildUnits() {
  using Kind = ModelUnit::Kind;
  units_.clear();
  units_.push_back({"model.embed_tokens",
                    Kind::kTextEmbedding,
                    0,
                    {{"model.embed_tokens", language_model->embed_tokens.ptr()}},
                    {}});
  patch_embed_unit_ = units_.size();
  units_.push_back({"visual.patch_embed",
                    Kind::kPatchEmbed,
                    0,
                    {{"visual.patch_embed", visual->patch_embed}},
                    {}});
  first_vision_block_unit_ = units_.size();
  for (size_t i = 0; i < visual->block_list.size(); ++i) {
    const std::string name = "visual.blocks." + std::to_string(i);
    units_.push_back(
        {name, Kind::kVisionBlock, static_cast<int64_t>(i), {{name, visual->block_list[i]}}, {}});
  }
  merger_unit_ = units_.size();
  units_.push_back({"visual.merger", Kind::kMerger, 0, {{"visual.merger", visual->merger}}, {}});
  first_decoder_unit_ = units_.size();
  for (size_t i = 0; i < language_model->layer_list.size(); ++i) {
    const std::string name = "model.layers." + std::to_string(i);
    units_.push_back({name,
                      Kind::kDecoderLayer,
                      static_cast<int64_t>(i),
                      {{name, language_model->layer_list[i]}},
                      {}});
  }
  head_unit_ = units_.size();
  ModelUnit head{"head", Kind::kHead, 0, {{"model.norm", language_model->norm}}, {}};
  if (score) {
    head.modules.emplace_back("score", score.ptr());
  } else if (lm_head) {
    head.modules.emplace_back("lm_head", lm_head.ptr());
  } else {
    head.borrowed.push_back("model.embed_tokens.weight");
  }
  units_.push_back(std::move(head));
}

torch::Tensor Qwen2VLForConditionalGeneration::RunUnit(size_t unit, const UnitFn& fn,
                                                       const torch::Tensor& input,
                                                       bool checkpoint) {
  const ModelUnit& u = units_[unit];
  if (hooks_ != nullptr) hooks_->BeforeUnit(u);
  torch::Tensor output;
  if (runner_ != nullptr) {
    output = runner_->RunUnit(u, fn, input, checkpoint);
  } else if (checkpoint) {
    std::vector<torch::Tensor> params;
    for (const auto& [name, tensor] : u.NamedParameters()) params.push_back(tensor);
    output = internal::CheckpointedCall(fn, input, params);
  } else {
    output = fn(input);
  }
  if (hooks_ != nullptr) hooks_->AfterUnit(u, output);
  return output;
}

torch::Tensor Qwen2VLForConditionalGeneration::EncodeImages(const torch::Tensor& pixel_values,
                                                            const torch::Tensor& grid_thw) {
  const int64_t patch_dim = config_.vision.patch_dim();
  TORCH_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == patch_dim,
              "pixel_values must be [num_patches, ", patch_dim, "], got ", pixel_values.sizes());
  const torch::Device device = visual->patch_embed->proj->weight.device();
  auto embed = visual->patch_embed;
  torch::Tensor h = RunUnit(
      patch_embed_unit_, [embed](const torch::Tensor& x) { return embed->forward(x); },
      pixel_values.to(device), /*checkpoint=*/false);
  const auto layout = std::make_shared<const VisionLayout>(
      MakeVisionLayout(config_.vision, grid_thw, h.size(0), device));
  // Qwen2.5-VL: the blocks see the patches window by window, the merger's output goes back.
  const int64_t merge_unit = config_.vision.spatial_merge_size * config_.vision.spatial_merge_size;
  if (layout->window_index.defined()) h = ToWindowOrder(h, layout->window_index, merge_unit);
  for (size_t i = 0; i < visual->block_list.size(); ++i) {
    auto block = visual->block_list[i];
    h = RunUnit(
        first_vision_block_unit_ + i,
        [block, layout](const torch::Tensor& x) { return block->forward(x, *layout); }, h,
        checkpointing_.vision_blocks);
  }
  auto merger = visual->merger;
  const torch::Tensor merged = RunUnit(
      merger_unit_, [merger](const torch::Tensor& x) { return merger->forward(x); }, h,
      /*checkpoint=*/false);
  return layout->window_inverse.defined() ? FromWindowOrder(merged, layout->window_inverse)
                                          : merged;
}

torch::Tensor Qwen2VLForConditionalGeneration::ForwardHidden(const ModelInputs& inputs) {
  return ForwardPrompt(inputs, nullptr);
}

torch::Tensor Qwen2VLForConditionalGeneration::Prefill(const ModelInputs& inputs, int64_t capacity,
                                                       KvCache& cache) {
  // An engine that recomputes units in backward would append to the cache twice.
  TORCH_CHECK(!torch::GradMode::is_enabled(), "Prefill runs under torch::NoGradGuard");
  cache = KvCache{};
  cache.layers.resize(language_model->layer_list.size());
  for (LayerKvCache& layer : cache.layers) layer.capacity = capacity;
  return ForwardPrompt(inputs, &cache);
}

torch::Tensor Qwen2VLForConditionalGeneration::DecodeStep(const torch::Tensor& ids,
                                                          KvCache& cache) {
  TORCH_CHECK(cache.rope_deltas.defined() && !cache.layers.empty() && cache.layers[0].key.defined(),
              "DecodeStep needs a cache filled by Prefill");
  TORCH_CHECK(
      cache.length < cache.layers[0].key.size(2) && cache.length < cache.attention_mask.size(1),
      "DecodeStep: the cache is full (", cache.length,
      " positions); Prefill with a larger capacity");
  const torch::Device device = language_model->embed_tokens->weight.device();
  if (!cache.step_position.defined()) {
    cache.step_position =
        torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  }
  cache.step_position.fill_(cache.length);
  torch::Tensor h = DecodeStepAt(ids.to(device, torch::kInt64), cache);
  ++cache.length;
  return h;
}

torch::Tensor Qwen2VLForConditionalGeneration::DecodeStepAt(const torch::Tensor& ids,
                                                            KvCache& cache) {
  TORCH_CHECK(!torch::GradMode::is_enabled(), "DecodeStep runs under torch::NoGradGuard");
  TORCH_CHECK(cache.rope_deltas.defined() &&
                  cache.layers.size() == language_model->layer_list.size() &&
                  cache.step_position.defined(),
              "DecodeStepAt needs a cache filled by Prefill and a step position");
  const int64_t batch = cache.rope_deltas.size(0);
  TORCH_CHECK(ids.defined() && ids.dim() == 2 && ids.size(0) == batch && ids.size(1) == 1,
              "DecodeStep: ids must be [", batch, ", 1], got ",
              ids.defined() ? ids.sizes() : torch::IntArrayRef{});
  auto embed = language_model->embed_tokens.ptr();
  torch::Tensor h = RunUnit(
      0,
      [embed, tp = vocab_parallel_](const torch::Tensor& x) { return EmbedTokens(*embed, tp, x); },
      ids, /*checkpoint=*/false);

  // Every shape below is the cache's capacity, whatever the step.
  const int64_t capacity = cache.layers[0].key.size(2);
  cache.attention_mask.index_fill_(1, cache.step_position, 1);
  const AttentionMask mask{
      cache.attention_mask.narrow(1, 0, capacity).ne(0).view({batch, 1, 1, capacity}), nullptr,
      nullptr};
  const torch::Tensor positions =
      (cache.rope_deltas + cache.step_position).view({1, batch, 1}).expand({3, batch, 1});
  const RotaryTables rope = MultimodalRotary(config_, positions, h.scalar_type());
  for (size_t i = 0; i < language_model->layer_list.size(); ++i) {
    auto layer = language_model->layer_list[i];
    LayerKvCache* layer_cache = &cache.layers[i];
    layer_cache->write_at = cache.step_position;
    h = RunUnit(
        first_decoder_unit_ + i,
        [layer, rope, mask, layer_cache](const torch::Tensor& x) {
          return layer->forward(x, rope, mask, layer_cache);
        },
        h, /*checkpoint=*/false);
  }
  return h;
}

torch::Tensor Qwen2VLForConditionalGeneration::ForwardPrompt(const ModelInputs& inputs,
                                                             KvCache* cache) {
  const torch::Tensor& ids = inputs.input_ids;
  TORCH_CHECK(ids.defined() && ids.dim() == 2, "input_ids must be [batch, seq], got ",
              ids.defined() ? ids.sizes() : torch::IntArrayRef{});
  TORCH_CHECK(!c10::isFloatingType(ids.scalar_type()), "input_ids must be integers, got ",
              ids.scalar_type());
  const int64_t batch = ids.size(0);
  const int64_t seq = ids.size(1);
  TORCH_CHECK(batch > 0 && seq > 0, "input_ids is empty: ", ids.sizes());
  if (inputs.attention_mask.defined()) {
    TORCH_CHECK(inputs.attention_mask.sizes() == ids.sizes(), "attention_mask has shape ",
                inputs.attention_mask.sizes(), " but input_ids has ", ids.sizes());
  }
  const torch::Device device = language_model->embed_tokens->weight.device();
  // What is read on the host (the ids' range, the image tokens, the positions, the padding and
  // the packing) is read from host tensors when the caller gives them: no device
  // synchronisation, and the ids reach the device by one asynchronous copy.
  const torch::Tensor ids_host = ids.is_cpu() ? ids.to(torch::kInt64) : torch::Tensor();
  const torch::Tensor ids_dev =
      ids_host.defined() ? ToDeviceAsync(ids_host, device) : ids.to(device, torch::kInt64);
  const torch::Tensor& ids_read = ids_host.defined() ? ids_host : ids_dev;
  {
    const int64_t lo = ids_read.min().item<int64_t>();
    const int64_t hi = ids_read.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < config_.vocab_size, "input_ids must lie in [0, ",
                config_.vocab_size, "), got values in [", lo, ", ", hi, "]");
  }

  auto embed = language_model->embed_tokens.ptr();
  torch::Tensor h = RunUnit(
      0,
      [embed, tp = vocab_parallel_](const torch::Tensor& x) { return EmbedTokens(*embed, tp, x); },
      ids_dev, /*checkpoint=*/false);

  if (inputs.pixel_values.defined()) {
    TORCH_CHECK(inputs.image_grid_thw.defined(), "pixel_values given without image_grid_thw");
    const torch::Tensor image = EncodeImages(inputs.pixel_values, inputs.image_grid_thw);
    const torch::Tensor is_image = ids_dev.eq(config_.image_token_id);
    const int64_t tokens = ids_read.eq(config_.image_token_id).sum().item<int64_t>();
    TORCH_CHECK(tokens == image.size(0), "image features and image tokens do not match: ", tokens,
                " <|image_pad|> tokens, ", image.size(0), " features");
    h = h.masked_scatter(is_image.unsqueeze(-1).expand_as(h), image.to(h.scalar_type()));
  } else if (run_vision_always_) {
    const int64_t m = config_.vision.spatial_merge_size;
    const torch::Tensor blank =
        torch::zeros({m * m, config_.vision.patch_dim()}, torch::TensorOptions().device(device));
    const torch::Tensor grid =
        torch::tensor({int64_t{1}, m, m}, torch::TensorOptions().dtype(torch::kInt64)).view({1, 3});
    h = h + EncodeImages(blank, grid).sum().to(h.scalar_type()) * 0;
  }

  const bool packed = inputs.segment_ids.defined();
  TORCH_CHECK(!packed || cache == nullptr, "a packed batch (segment_ids) cannot start decoding");
  torch::Tensor positions = ToDeviceAsync(GetRopeIndex(config_, ids_read, inputs.image_grid_thw,
                                                       inputs.attention_mask, inputs.segment_ids),
                                          device);
  AttentionMask mask = MaskFor(inputs, device);
  if (cache != nullptr) StartCache(inputs.attention_mask, positions, batch, seq, device, *cache);
  // Sequence parallelism: the layers see this rank's slice (sequence_parallel.h).
  const bool split = sequence_ != nullptr && sequence_->size > 1 && cache == nullptr;
  if (split) SplitSequence(seq, &h, &positions, &mask);
  const RotaryTables rope = MultimodalRotary(config_, positions, h.scalar_type());
  for (size_t i = 0; i < language_model->layer_list.size(); ++i) {
    auto layer = language_model->layer_list[i];
    LayerKvCache* layer_cache = cache != nullptr ? &cache->layers[i] : nullptr;
    h = RunUnit(
        first_decoder_unit_ + i,
        [layer, rope, mask, layer_cache](const torch::Tensor& x) {
          return layer->forward(x, rope, mask, layer_cache);
        },
        h, checkpointing_.decoder_layers && cache == nullptr);
  }
  return split ? GatherSequence(h, seq, *sequence_) : h;
}

void Qwen2VLForConditionalGeneration::SetTensorParallel(
    std::shared_ptr<const TensorParallel> tensor_parallel) {
  for (const auto& layer : language_model->layer_list) {
    layer->mlp->tensor_parallel = tensor_parallel;
    layer->self_attn->SetTensorParallel(tensor_parallel);
  }
  const bool vocab =
      tensor_parallel && tensor_parallel->size > 1 && tensor_parallel->vocab_parallel;
  vocab_parallel_ = vocab ? tensor_parallel : nullptr;
}

void Qwen2VLForConditionalGeneration::SplitSequence(int64_t seq, torch::Tensor* h,
                                                    torch::Tensor* positions,
                                                    AttentionMask* mask) const {
  TORCH_CHECK(!mask->packed, "sequence parallelism does not take packed rows yet");
  const int64_t padded = PaddedLength(seq, *sequence_);
  *h = SliceSequence(*h, 1, padded, *sequence_);
  *positions = SliceSequence(*positions, 2, padded, *sequence_, /*repeat_last=*/true);
  // The key mask covers the whole padded length: attention sees every position of its heads.
  if (mask->allowed.defined() && padded > seq) {
    const torch::Tensor& allowed = mask->allowed;
    mask->allowed = torch::cat(
        {allowed,
         torch::zeros_like(allowed.narrow(3, 0, 1)).expand({allowed.size(0), 1, 1, padded - seq})},
        3);
  }
  mask->sequence = sequence_;
}

AttentionMask Qwen2VLForConditionalGeneration::MaskFor(const ModelInputs& inputs,
                                                       const torch::Device& device) const {
  AttentionMask mask;
  if (inputs.segment_ids.defined()) {
    // Each sample attends on its own (sum of length^2, not T^2; no [B, 1, T, T] mask).
    mask.packed = std::make_shared<const PackedSamples>(PackedSamplesOf(inputs.segment_ids));
    return mask;
  }
  // Without padding, attention is plainly causal: no mask tensor, so fused kernels take their
  // fastest path. The padding check reads the mask where it is (a host mask costs no device
  // synchronisation; a batch's mask is one, see ToModelInputs).
  if (inputs.attention_mask.defined() && inputs.attention_mask.eq(0).any().item<bool>()) {
    // The key mask alone: attention narrows it causally a block of queries at a time, so no
    // [B, 1, T, T] mask exists (CausalPaddingMask is what it amounts to).
    const torch::Tensor& m = inputs.attention_mask;
    mask.allowed = ToDeviceAsync(m, device).ne(0).view({m.size(0), 1, 1, m.size(1)});
  }
  return mask;
}

torch::Tensor Qwen2VLForConditionalGeneration::Head(const torch::Tensor& hidden) {
  auto norm = language_model->norm;
  std::shared_ptr<torch::nn::LinearImpl> head =
      score ? score.ptr() : (lm_head ? lm_head.ptr() : nullptr);
  auto embed = language_model->embed_tokens.ptr();
  // A score head is never split; a language-model head split by vocabulary rows is gathered.
  std::shared_ptr<const TensorParallel> tp = score ? nullptr : vocab_parallel_;
  return RunUnit(
      head_unit_,
      [norm, head, embed, tp](const torch::Tensor& x) {
        if (!tp) {
          const torch::Tensor normed = norm->forward(x);
          return head ? head->forward(normed) : torch::linear(normed, embed->weight);
        }
        // Split by vocabulary rows: each rank's logits of its rows, gathered; in backward the
        // input's gradient is the sum of every rank's rows' part.
        const torch::Tensor normed = CopyToTensorParallel(norm->forward(x), *tp);
        return GatherVocabParallel(torch::linear(normed, head ? head->weight : embed->weight), *tp);
      },
      hidden, /*checkpoint=*/false);
}

torch::Tensor Qwen2VLForConditionalGeneration::HeadCrossEntropy(const torch::Tensor& hidden,
                                                                const torch::Tensor& labels,
                                                                int64_t chunk_rows) {
  TORCH_CHECK(!score, "HeadCrossEntropy: this model has a score head, not a language-model head");
  auto norm = language_model->norm;
  std::shared_ptr<torch::nn::LinearImpl> head = lm_head ? lm_head.ptr() : nullptr;
  auto embed = language_model->embed_tokens.ptr();
  return RunUnit(
      head_unit_,
      [norm, head, embed, labels, chunk_rows, tp = vocab_parallel_](const torch::Tensor& x) {
        const torch::Tensor& weight = head ? head->weight : embed->weight;
        if (tp) {
          return internal::VocabParallelCrossEntropySum(norm->forward(x), weight, labels, *tp,
                                                        /*ignore_index=*/-100, chunk_rows);
        }
        return internal::LinearCrossEntropySum(norm->forward(x), weight, labels,
                                               /*ignore_index=*/-100, chunk_rows);
      },
      hidden, /*checkpoint=*/false);
}

void Qwen2VLForConditionalGeneration::SetAttentionImpl(AttentionImpl impl) {
  attention_ = impl;
  for (const auto& layer : language_model->layer_list) layer->self_attn->attention = impl;
  for (const auto& block : visual->block_list) block->attn->attention = impl;
}

torch::Tensor Qwen2VLForConditionalGeneration::forward(const ModelInputs& inputs) {
  return Head(ForwardHidden(inputs));
}

absl::StatusOr<torch::Tensor> ForwardOrStatus(Qwen2VLForConditionalGeneration& model,
                                              const ModelInputs& inputs) {
  return Guarded(
      "", [&] { return absl::StatusOr<torch::Tensor>(model.forward(inputs)); },
      absl::StatusCode::kInvalidArgument);
}

}  // namespace trainctl::model
