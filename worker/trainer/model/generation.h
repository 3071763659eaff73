// KV-cached generation with Qwen2VLForConditionalGeneration: one prefill over the (left-padded)
// prompts, images included, then one token per row per step; greedy or seeded sampling
// (temperature, top-k, top-p, applied in that order as HF's and TRL's logits processors); per-row
// stop at an eos id or max_new_tokens; lock-step across ranks for a sharded (ZeRO-3) model.
//
// Every unit still runs through the model's RunUnit, so an engine's UnitRunner gathers and frees
// sharded weights per unit in prefill and in every decode step.
//
// Rotary positions of generated tokens continue each row's prompt: the token at cache position s
// of row b gets s + rope_delta[b] on all three M-RoPE axes, rope_delta = (largest prompt
// position + 1) - padded prompt length (HF's rope_deltas). A left-padded row thus decodes as it
// would alone, and as a full forward over prompt + completion (attention_mask marking both)
// scores it: CompletionLogProbs agrees with what Generate sampled from.
//
// Not thread-safe, like the model: one Generate at a time per model.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_GENERATION_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_GENERATION_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/trainer/model/qwen2vl.h"

namespace trainctl::model {

// Qwen2-VL's end-of-turn and end-of-text ids, the defaults when a model directory names none.
inline constexpr int64_t kImEndTokenId = 151645;      // <|im_end|>
inline constexpr int64_t kEndOfTextTokenId = 151643;  // <|endoftext|>

struct GenerationOptions {
  int64_t max_new_tokens = 0;  // > 0
  // 0: greedy (argmax of the logits; top_k / top_p / seed unused). Otherwise logits / temperature.
  double temperature = 1.0;
  double top_p = 1.0;  // in (0, 1]; 1 = off. Keeps the smallest top set with mass >= top_p.
  int64_t top_k = 0;   // 0 = off; else keeps the k largest logits
  // Seeds the CPU generator that draws every sample (one uniform number per row and token; the
  // token is found by inverse transform over the cumulative distribution, internal/sampling.h,
  // on the logits' device for CUDA, by parallel block sums on the CPU): the same seed, model and
  // prompts give the same tokens, and a CPU and a CUDA run differ only where their
  // probabilities differ by rounding at a draw's boundary.
  uint64_t seed = 0;
  // When set, one seed per row instead: row b draws from its own generator seeded row_seeds[b],
  // so a row's tokens do not depend on which other rows share its batch (GRPO seeds each
  // completion, and the same rollouts come out on any number of ranks).
  std::vector<uint64_t> row_seeds;
  std::vector<int64_t> eos_token_ids;        // a row stops after emitting any of them; may be empty
  int64_t pad_token_id = kEndOfTextTokenId;  // fed for rows that have stopped
  // Multi-rank lock-step: called once per step with whether every local row has stopped; the
  // generator stops when it returns true (it must return the same on every rank, e.g. an
  // all-reduce of the flags) and otherwise keeps stepping, feeding pad to stopped rows, so that
  // ranks issue the same per-unit collectives. Unset: stop when every local row has stopped.
  // Every rank must pass the same max_new_tokens, so all eventually agree.
  std::function<bool(bool this_rank_done)> all_done;
  // CUDA builds, on a CUDA model without a unit runner (or with units_resident): capture the first
  // decoding step as a CUDA graph and replay it for the others (the same kernels, one launch).
  bool cuda_graph = true;
  // Set when the caller holds every unit's weights gathered for the whole call (the ZeRO engine's
  // HoldWeights): a unit runner then issues no collective, and the graph may capture it.
  bool units_resident = false;
  // CPU models: a row that finished (eos or max_new_tokens) leaves the decoding batch, its
  // cache rows dropped, so later steps compute only the open rows. Same tokens as keeping it
  // (up to rounding in kernels whose order of summation depends on the batch size). CUDA models
  // keep the batch whole (fixed shapes for the graph) and feed finished rows pad.
  bool compact_finished_rows = true;
};

struct GenerationOutput {
  // The new tokens of each row, up to and including its eos token; no padding.
  std::vector<std::vector<int64_t>> tokens;
  std::vector<bool> stopped;  // true: ended with an eos id; false: cut at max_new_tokens
  int64_t decode_steps = 0;   // DecodeStep calls (each after the prefill's first token)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t new_tokens = 0;  // sum of tokens[b].size()
};

// Generates continuations of `prompts`: input_ids [B, T] left-padded (every row's last token at
// T - 1), attention_mask [B, T] (may be undefined when no row is padded), pixel_values and
// image_grid_thw for the <|image_pad|> runs (may be undefined). Runs under NoGradGuard; the
// model's train/eval mode is the caller's. INVALID_ARGUMENT for bad options or inputs the model
// rejects (with its message), or a padding layout that is not left padding.
absl::StatusOr<GenerationOutput> Generate(Qwen2VLForConditionalGeneration& model,
                                          const ModelInputs& prompts,
                                          const GenerationOptions& options);

// Left-pads variable-length prompts into input_ids [B, max length] (padding `pad_token_id`) and
// attention_mask [B, max length] (0 on padding), int64 on the CPU. `prompts` must be non-empty,
// with no empty row (INVALID_ARGUMENT otherwise).
absl::StatusOr<ModelInputs> LeftPadPrompts(const std::vector<std::vector<int64_t>>& prompts,
                                           int64_t pad_token_id = kEndOfTextTokenId);

// Log-probabilities [B, C] float32 of the completion tokens under the model: one full forward
// (ForwardHidden) over `prompt_and_completion` — a left-padded prompt block of width
// `completion_start` followed by a right-padded completion block of width C, attention_mask
// marking the real tokens of both — then Head and a float32 log_softmax on only the C positions
// that predict completion tokens. Runs with the caller's grad mode, so a policy's loss can
// backpropagate through it; entries at completion padding are finite and meaningless (mask them).
// Throws c10::Error as forward() does, or when completion_start is not in [1, T).
torch::Tensor CompletionLogProbs(Qwen2VLForConditionalGeneration& model,
                                 const ModelInputs& prompt_and_completion,
                                 int64_t completion_start);

// CompletionLogProbs for rows packed padding-free (GRPO with training.packing): one forward over
// `packed` (segment_ids set: each row a sample of its own, positions restarting), then Head and a
// float32 log_softmax on only the positions that predict completion tokens. `predictors` [b, C]
// int64 holds, for completion token j of row i, the flat index (packed row * T + position) of the
// position before it, and `targets` [b, C] int64 the token; entries past a row's completion must
// still be valid indices and tokens (their results are finite and meaningless). Returns [b, C]
// float32, equal to CompletionLogProbs on the padded layout up to rounding. Throws c10::Error as
// forward() does, or on bad shapes.
torch::Tensor PackedCompletionLogProbs(Qwen2VLForConditionalGeneration& model,
                                       const ModelInputs& packed, const torch::Tensor& predictors,
                                       const torch::Tensor& targets);

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_GENERATION_H_
