// Qwen2-VL and Qwen2.5-VL (config.family()) for conditional generation, in LibTorch: the vision
// tower (vision_tower.h) feeding the Qwen2 decoder (text_decoder.h), with parameter names
// identical to HF checkpoints (`visual.blocks.0.attn.qkv.weight`,
// `model.layers.0.self_attn.q_proj.weight`, `lm_head.weight` unless the embeddings are tied), so
// `named_parameters()` is the checkpoint's key list.
//
// Single-device code (torchtitan's split): sharding, prefetching and offload belong to the ZeRO-3
// engine, which wraps this model through Units() and UnitHooks without touching it.
//
// Not thread-safe: one forward at a time per instance, like any torch::nn::Module.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_QWEN2VL_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_QWEN2VL_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/text_decoder.h"
#include "worker/trainer/model/vision_tower.h"

namespace trainctl::model {

struct ModelInputs {
  torch::Tensor input_ids;       // [B, T] int64
  torch::Tensor attention_mask;  // [B, T] int64, 1 = token, 0 = padding; may be undefined
  torch::Tensor pixel_values;    // [N, patch_dim] float; may be undefined
  torch::Tensor image_grid_thw;  // [n, 3] int64; may be undefined
  // [B, T] int64, a packed batch's samples: 1, 2, ... for the samples of a row in order, 0 on
  // padding; may be undefined (one sample per row). Samples of a row never attend to each other
  // and their positions (M-RoPE included) restart at 0, so a packed row computes what its samples
  // would alone: each sample is attended on its own (PackedCausalAttention, sum of length^2
  // rather than T^2 scores). Not for Prefill. (Initialised so that brace-initialising the fields
  // above leaves it out without a missing-initializer warning.)
  torch::Tensor segment_ids = {};
};

// The 3-D (t, h, w) rotary position ids [3, B, T] int64 that HF's get_rope_index computes: text
// tokens count up on all three axes; the merged patches of an image (its <|image_pad|> run after
// <|vision_start|>) get t/h/w grid indices offset by the position where the image starts
// (Qwen2.5-VL: t stays 0 over an image's frames, HF's time scale for images); text after an image
// resumes at one past the largest id so far. Padding (attention_mask 0) gets 1.
// Without image_grid_thw: cumsum(mask) - 1 (or 0..T-1). Images are consumed from image_grid_thw
// in order across the batch. Throws c10::Error when the pads do not match the grids, or
// (Qwen2.5-VL, with grids) on a video's tokens (<|vision_start|><|video_pad|>): no video input
// exists here.
// With segment_ids ([B, T], as ModelInputs), each run of one non-zero id is a sequence of its own
// whose positions restart at 0, and 0 marks padding.
torch::Tensor GetRopeIndex(const Qwen2VLConfig& config, const torch::Tensor& input_ids,
                           const torch::Tensor& image_grid_thw, const torch::Tensor& attention_mask,
                           const torch::Tensor& segment_ids = {});

// `t` on `device`; from the host to a GPU through pinned memory without waiting for the copy
// (a plain copy from pageable memory synchronises the host with the device).
torch::Tensor ToDeviceAsync(const torch::Tensor& t, const torch::Device& device);

// The attention mask of a packed batch, [B, 1, T, T] bool (true = may attend): causal within a
// sample (same non-zero segment id), never across; a padding position attends to itself only.
// What per-sample attention amounts to; the model does not build it (tests compare with it).
torch::Tensor PackedCausalMask(const torch::Tensor& segment_ids, const torch::Device& device);

// A group of parameters that runs as one step of the forward: the granularity at which a ZeRO-3
// engine gathers and frees weights and at which activations are checkpointed.
struct ModelUnit {
  enum class Kind { kTextEmbedding, kPatchEmbed, kVisionBlock, kMerger, kDecoderLayer, kHead };

  std::string name;  // the module path: "model.layers.3", "visual.merger", "head", ...
  Kind kind;
  int64_t index;  // layer / block number; 0 for the others
  // The modules whose parameters this unit owns, with their HF name prefixes. Every parameter of
  // the model is owned by exactly one unit.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  // Parameters this unit reads but another owns: "model.embed_tokens.weight" for a tied head.
  std::vector<std::string> borrowed;

  // The owned parameters with their full HF names.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const;
};

// Observes each unit as it runs (not its recomputation in backward). An engine gathers the
// unit's weights in BeforeUnit, frees them in AfterUnit, and may register hooks on `output` to
// re-gather them before the unit's backward. Called on the thread running forward.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void BeforeUnit(const ModelUnit& unit) = 0;
  virtual void AfterUnit(const ModelUnit& unit, const torch::Tensor& output) = 0;
};

// Runs a unit in place of the model, given the unit's forward `fn`: an engine that shards weights
// gathers them, runs fn, frees them and arranges its own backward. `checkpoint` is the model's
// gradient-checkpointing choice for the unit. Called on the thread running forward.
class UnitRunner {
 public:
  using UnitFn = std::function<torch::Tensor(const torch::Tensor&)>;
  virtual ~UnitRunner() = default;
  virtual torch::Tensor RunUnit(const ModelUnit& unit, const UnitFn& fn, const torch::Tensor& input,
                                bool checkpoint) = 0;
};

// The state of incremental decoding (Prefill, then DecodeStep per token): every decoder layer's
// keys and values, which cache positions hold tokens, and the rotary offset of each row.
struct KvCache {
  std::vector<LayerKvCache> layers;
  torch::Tensor attention_mask;  // [B, >= length] int64 on the model's device; 1 = token
  // [B] int64: a token at cache position s has rotary position s + rope_deltas[b] on all three
  // axes. Prefill sets it to (largest prompt position + 1) - padded prompt length, as HF's
  // rope_deltas, so generated tokens continue right after each row's prompt whatever its padding.
  torch::Tensor rope_deltas;
  int64_t length = 0;  // positions filled
  // [1] int64 on the model's device: the cache position the next DecodeStepAt writes; the only
  // input of a decoding step besides the ids that changes from one step to the next.
  torch::Tensor step_position;
};

struct GradientCheckpointing {
  bool decoder_layers = false;  // recompute each decoder layer in backward
  bool vision_blocks = false;   // recompute each vision block in backward
};

class Qwen2VLForConditionalGeneration : public torch::nn::Module {
 public:
  // Builds the model with HF's initialisation (normal(0, 0.02) weights, zero biases, unit norms)
  // on the CPU in float32; use to() for another dtype or device. `config` must be valid (as
  // ParseQwen2VLConfig returns it).
  //
  // Each unit is initialised from its own generator, seeded from one draw of the default
  // generator and the unit's name, so a unit's initial weights do not depend on which other units
  // exist or on the order they are built in. `unit_built`, when set, is called once per unit as
  // soon as its weights are built and initialised, before the next unit is allocated, with the
  // unit's name and its parameters (full HF names): an engine that shards the model copies its
  // slice and frees the tensors' storage there, so no process ever holds the whole model.
  using UnitBuilt = std::function<void(
      const std::string& unit, const std::vector<std::pair<std::string, torch::Tensor>>& params)>;
  explicit Qwen2VLForConditionalGeneration(const Qwen2VLConfig& config,
                                           const UnitBuilt& unit_built = nullptr);

  // Logits [B, T, vocab] in the model's dtype. Image features replace the <|image_pad|>
  // embeddings in order. Throws c10::Error (with what is wrong) on bad shapes, pad/feature count
  // mismatches or grids that do not match pixel_values; ForwardOrStatus returns that as a status.
  torch::Tensor forward(const ModelInputs& inputs);

  // The last decoder layer's output [B, T, hidden], before the final norm; Head() maps it (or
  // slices of it, to bound the memory of [.., vocab] logits) to logits. forward() is both.
  torch::Tensor ForwardHidden(const ModelInputs& inputs);

  // ForwardHidden on a prompt that also starts incremental decoding: resets `cache` and fills it
  // with the prompt's keys and values (room for `capacity` positions in all, the prompt
  // included; grown when passed). The vision tower runs here, once. Every row needs at least one
  // token (attention_mask 1); left padding keeps every row's last token at the end. Throws
  // c10::Error as forward(), or when grad mode is on: Prefill and DecodeStep run under
  // torch::NoGradGuard (a unit recomputed in backward would append to the cache twice).
  torch::Tensor Prefill(const ModelInputs& inputs, int64_t capacity, KvCache& cache);

  // One token per row, `ids` [B, 1] int64, appended after the cache's positions: returns the last
  // decoder layer's output [B, 1, hidden] for Head(). The token attends to every cached token and
  // itself. Every unit it uses (embeddings, decoder layers) runs through RunUnit as in forward.
  // The cache must have room (Prefill's capacity): a step never reallocates it. DecodeStepAt at
  // cache.length, then length + 1.
  torch::Tensor DecodeStep(const torch::Tensor& ids, KvCache& cache);

  // The step itself, with every shape fixed for the cache's capacity: `ids` [B, 1] int64 on the
  // model's device are written at cache.step_position (a device tensor set by the caller), and
  // every row attends over the whole capacity under the cache's mask (positions not yet written
  // hold zeros and are masked out). No host synchronisation and no allocation whose size depends
  // on the step, so a CUDA graph can capture it once and replay it for every later step with new
  // ids and position (Generate does on CUDA). Leaves cache.length to the caller.
  torch::Tensor DecodeStepAt(const torch::Tensor& ids, KvCache& cache);

  // The head unit: final RMSNorm, then lm_head (or the tied embedding matrix): [.., hidden] ->
  // [.., vocab]; with a score head (config.num_labels > 0), `score`: [.., num_labels].
  torch::Tensor Head(const torch::Tensor& hidden);

  // The head unit fused with the cross-entropy of its logits: the summed loss of `hidden`
  // [N, hidden] against `labels` [N] (rows labelled -100 ignored), a float32 scalar, equal in
  // value and gradients to cross_entropy(Head(hidden).to(float32), labels, sum) but computed a
  // chunk of rows at a time (internal/linear_cross_entropy.h), so the [N, vocab] logits never
  // exist whole. `chunk_rows` 0: ~2^27 logits per chunk. Not with a score head.
  torch::Tensor HeadCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& labels,
                                 int64_t chunk_rows = 0);

  // Image features [N / merge^2, hidden] for pixel_values [N, patch_dim].
  torch::Tensor EncodeImages(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw);

  // Re-applies HF's initialisation (normal(0, std) weights, zero biases, unit norms) with a fresh
  // draw from the default generator (torch::manual_seed makes it reproducible).
  void InitWeights(double std = 0.02);

  const Qwen2VLConfig& config() const { return config_; }

  // The units in execution order: model.embed_tokens, visual.patch_embed, visual.blocks.N,
  // visual.merger, model.layers.N, head (model.norm + lm_head). The vision units are skipped by
  // a forward without images.
  const std::vector<ModelUnit>& Units() const { return units_; }

  // Not owned; must outlive every forward while set. nullptr removes them.
  void SetUnitHooks(UnitHooks* hooks) { hooks_ = hooks; }
  // Not owned, as hooks. While set, every unit runs through it.
  void SetUnitRunner(UnitRunner* runner) { runner_ = runner; }
  bool HasUnitRunner() const { return runner_ != nullptr; }

  // Off by default. When on, a forward without images still runs the vision tower, on one blank
  // image whose features are added to nothing (times zero): every unit runs in every forward, as
  // an engine whose ranks must issue the same collectives needs when some ranks' batches have
  // images and others' do not.
  void SetRunVisionAlways(bool on) { run_vision_always_ = on; }

  // Which attention every decoder layer and vision block runs (attention.h). kAuto, the default,
  // is the fused kernel on CUDA in LibTorch 2.x builds and eager otherwise.
  void SetAttentionImpl(AttentionImpl impl);
  AttentionImpl attention_impl() const { return attention_; }

  // Off (null, or size 1) by default. With it, a forward without a KV cache runs the decoder
  // layers on this rank's slice of the sequence and Ulysses attention over the group
  // (sequence_parallel.h); ForwardHidden still returns the whole sequence. Every rank of the
  // group must run the same forwards on the same batch.
  void SetSequenceParallel(std::shared_ptr<const SequenceParallel> sequence) {
    sequence_ = std::move(sequence);
  }

  // Off (null, or size 1) by default. The decoder layers' MLP weights (with tensor_parallel->
  // attention their attention projections too, and with vocab_parallel the embedding's and the
  // head's rows) must already be this rank's slices (tensor_parallel.h: the engine slices them as
  // it builds the model); each MLP and attention then sums its parts over the group, the
  // embedding its lookups, and the head's logits are gathered or its loss combined. Every rank
  // of the group must run the same forwards on the same batch.
  void SetTensorParallel(std::shared_ptr<const TensorParallel> tensor_parallel);

  // Off by default. Takes effect for forwards run with grad mode on.
  void SetGradientCheckpointing(const GradientCheckpointing& options) { checkpointing_ = options; }
  const GradientCheckpointing& gradient_checkpointing() const { return checkpointing_; }

  std::shared_ptr<Qwen2VisionTransformer> visual;
  std::shared_ptr<Qwen2VLTextModel> language_model;  // registered as "model"
  torch::nn::Linear lm_head{nullptr};                // null when tied or with a score head
  // HF *ForSequenceClassification's `score` [num_labels, hidden], no bias; only when
  // config.num_labels > 0, which replaces lm_head (and any tying) with it.
  torch::nn::Linear score{nullptr};

 private:
  using UnitFn = std::function<torch::Tensor(const torch::Tensor&)>;

  void BuildUnits();
  static uint64_t DrawBaseSeed();
  static void InitUnitModules(const std::string& unit,
                              const std::vector<std::pair<std::string, torch::nn::Module*>>& parts,
                              uint64_t base_seed, double std);
  torch::Tensor RunUnit(size_t unit, const UnitFn& fn, const torch::Tensor& input, bool checkpoint);
  // ForwardHidden's body; with `cache`, Prefill's.
  torch::Tensor ForwardPrompt(const ModelInputs& inputs, KvCache* cache);
  // Where the decoder's queries may look for `inputs`: packed samples, the key padding, or none.
  AttentionMask MaskFor(const ModelInputs& inputs, const torch::Device& device) const;
  // Sequence parallelism: the embeddings, positions and key mask of the whole sequence (`seq`
  // long) turned into this rank's slices, padded to a multiple of the group's size.
  void SplitSequence(int64_t seq, torch::Tensor* h, torch::Tensor* positions,
                     AttentionMask* mask) const;

  Qwen2VLConfig config_;
  std::vector<ModelUnit> units_;
  size_t patch_embed_unit_ = 0;
  size_t first_vision_block_unit_ = 0;
  size_t merger_unit_ = 0;
  size_t first_decoder_unit_ = 0;
  size_t head_unit_ = 0;
  UnitHooks* hooks_ = nullptr;
  UnitRunner* runner_ = nullptr;
  bool run_vision_always_ = false;
  std::shared_ptr<const SequenceParallel> sequence_;
  // Set when the embedding and the head are split by vocabulary rows (tensor_parallel.h).
  std::shared_ptr<const TensorParallel> vocab_parallel_;
  GradientCheckpointing checkpointing_;
  AttentionImpl attention_ = AttentionImpl::kAuto;
};

// forward() with c10::Error turned into INVALID_ARGUMENT carrying its message.
absl::StatusOr<torch::Tensor> ForwardOrStatus(Qwen2VLForConditionalGeneration& model,
                                              const ModelInputs& inputs);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_QWEN2VL_H_
