// Resolves a DeepSpeed JSON config the way the HF Trainer's DeepSpeed integration and DeepSpeed's
// own config checks would, against the flags of a trainctl job, into a typed view the trainer
// consumes.
//
// Resolution follows transformers' `HfTrainerDeepSpeedConfig`:
//   * an "auto" value is replaced by the job's flag (or by a value derived from the model's hidden
//   size
//     or the step count);
//   * an explicit value that disagrees with the flag it shadows is an error naming both;
// and DeepSpeed's checks: train_batch_size == world_size * micro batch * accumulation, bf16 and
// fp16 not both on, every key of the right type. Keys DeepSpeed has but trainctl does not implement
// are warnings
// ("ignored") unless they ask for a behaviour trainctl cannot give (nvme offload, apex amp, ...),
// which are errors. Unknown keys are warnings.
//
// One source for each training value (the engine's options, worker/trainer/zero/engine_options.cc,
// take each from exactly one place):
//   * with a DeepSpeed config, the resolved config: micro batch, accumulation, gradient_clipping,
//     the optimizer's lr/betas/eps/weight_decay (when it has an "optimizer" section), bf16/fp16
//     and loss scaling, ZeRO stage, buckets, offload. Its "auto" values were filled from the
//     job's flags, so a flag and the config never disagree (an explicit mismatch is an error);
//   * without one, or for a value the config does not carry, the job's training arguments
//     (max_grad_norm, learning_rate, adam_*, weight_decay, bf16/fp16);
//   * always the training arguments: the schedule (lr_scheduler_type, warmup), steps and epochs,
//     logging and saving, seed, gradient checkpointing;
//   * the model's hidden size fills the bucket sizes left "auto" (reduce_bucket_size,
//     stage3_prefetch_bucket_size, stage3_param_persistence_threshold) on the ranks, where the
//     model is known.
//
// Where it is resolved: the coordinator resolves a job's config (ResolveDeepSpeedConfig) when it
// is submitted and again for each launch whose flags a remedy changed (coordinator/job_launch.h),
// filling every "auto" it can know; the worker hands that document to the ranks untouched, in
// the launch file (worker/daemon/worker.cc); the trainer fills only the hidden-size "auto"s
// (FillModelAutos), reads the typed view (ReadResolvedDeepSpeedConfig) and reports what it filled
// in its `setup` event.
//
// Everything here is a pure function of its arguments and is safe to call from any thread.
#ifndef TRAINCTL_COMMON_DEEPSPEED_CONFIG_H_
#define TRAINCTL_COMMON_DEEPSPEED_CONFIG_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace trainctl {

// What the HF Trainer would pass to the DeepSpeed integration, taken from the job's flags.
struct DeepSpeedInputs {
  int world_size = 1;   // data-parallel ranks: nodes * slots_per_node / (tensor x sequence)
  int micro_batch = 8;  // --per_device_train_batch_size
  int grad_accum = 1;   // --gradient_accumulation_steps
  double learning_rate = 5e-5;
  double max_grad_norm = 1.0;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  bool bf16 = false, fp16 = false;
  // The model's hidden size. Unknown: the hidden-size "auto"s stay "auto" (with a warning) for the
  // trainer to resolve from the model's config.json.
  std::optional<int64_t> hidden_size;
  // Optimizer steps of the whole run, and of its warm-up. Unknown: the scheduler's step "auto"s
  // stay "auto" (with a warning) for the trainer to resolve once the data set is sized.
  std::optional<int64_t> total_steps;
  std::optional<int64_t> warmup_steps;
};

enum class OffloadDevice { kNone, kCpu };

struct DeepSpeedOffload {
  OffloadDevice device = OffloadDevice::kNone;
  bool pin_memory = false;
};

// fp16 mixed precision with dynamic loss scaling (loss_scale 0) or a static scale.
struct DeepSpeedFp16 {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;  // 0: dynamic
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct DeepSpeedActivationCheckpointing {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct DeepSpeedOptimizer {
  std::string type;  // "Adam" or "AdamW" (DeepSpeed matches the name case-insensitively)
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Decoupled weight decay. DeepSpeed's "Adam" uses it unless params.adam_w_mode is false; "AdamW"
  // always does.
  bool adam_w_mode = true;
};

struct DeepSpeedScheduler {
  std::string type;  // "WarmupLR", "WarmupDecayLR" or "WarmupCosineLR"
  // WarmupLR / WarmupDecayLR.
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  // nullopt: "auto" left for the trainer (DeepSpeedInputs::warmup_steps / total_steps unknown).
  // total_num_steps is also nullopt for WarmupLR, which has none.
  std::optional<int64_t> warmup_num_steps = 1000;
  std::optional<int64_t> total_num_steps;
  std::string warmup_type = "log";  // "log" or "linear"
  // WarmupCosineLR: ratios of the optimizer's lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
};

// The typed, resolved view of a DeepSpeed config. Absent keys take DeepSpeed's defaults.
struct DeepSpeedConfig {
  // zero_optimization
  int stage = 0;
  DeepSpeedOffload offload_optimizer;  // device kNone at stage 0, where DeepSpeed ignores it
  DeepSpeedOffload offload_param;      // device kNone below stage 3, where DeepSpeed ignores it
  bool overlap_comm = false;           // DeepSpeed's default: true at stage 3, false below
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;
  int64_t sub_group_size = 1000000000;
  // nullopt: "auto" left for the trainer to derive from the model's hidden size.
  std::optional<int64_t> reduce_bucket_size = 500000000;
  std::optional<int64_t> stage3_prefetch_bucket_size = 50000000;
  std::optional<int64_t> stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;

  // Precision. An absent bf16/fp16 section follows --bf16/--fp16, as accelerate adds the section.
  bool bf16_enabled = false;
  DeepSpeedFp16 fp16;

  // Batch: train_batch_size == world_size * micro_batch * grad_accum always holds.
  int64_t train_batch_size = 0;
  int64_t micro_batch = 0;
  int64_t grad_accum = 0;
  double gradient_clipping = 0.0;  // 0: no clipping

  DeepSpeedActivationCheckpointing activation_checkpointing;
  // nullopt: the section is absent and the trainer builds its own optimizer / scheduler from its
  // flags, as the HF Trainer does.
  std::optional<DeepSpeedOptimizer> optimizer;
  std::optional<DeepSpeedScheduler> scheduler;

  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool zero_allow_untested_optimizer = false;  // true when the trainer builds the optimizer
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
};

struct ResolvedDeepSpeedConfig {
  // The input document with every resolvable "auto" replaced, and train_batch_size filled in.
  nlohmann::json json;
  DeepSpeedConfig config;
  // One line each, "deepspeed.<key.path>: <why ignored or left unresolved>".
  std::vector<std::string> warnings;
};

// Parses JSON text. A syntax error is INVALID_ARGUMENT naming `source` (e.g. the file path), the
// line, column and byte offset.
absl::StatusOr<nlohmann::json> ParseDeepSpeedJson(std::string_view text, std::string_view source);

// Resolves `doc` against the job's flags `in`. On error returns INVALID_ARGUMENT whose message is
// every error found, one per line, each "deepspeed.<key.path>: <what is wrong>"; invalid inputs (a
// non-positive batch size, --bf16 with --fp16, ...) are reported first, alone, as "--<flag>:
// <what>". `doc` by value: a caller done with its document moves it in, and nothing is copied.
absl::StatusOr<ResolvedDeepSpeedConfig> ResolveDeepSpeedConfig(nlohmann::json doc,
                                                               const DeepSpeedInputs& in);

// The trainer's half of the resolution, on the document the coordinator resolved (the launch's
// `resolved_deepspeed_config_json`): fills the hidden-size "auto"s it left (HF's rules:
// reduce_bucket_size h*h, stage3_prefetch_bucket_size int(0.9*h*h),
// stage3_param_persistence_threshold 10*h) and returns each key it filled, by its dotted path, with
// the value. Explicit values stand. Nothing else is checked or changed.
std::map<std::string, int64_t> FillModelAutos(int64_t hidden_size, nlohmann::json* resolved);

// The typed view of a document ResolveDeepSpeedConfig returned (its `json`), without checking it
// again: the coordinator did. `in` gives what the document leaves to the job's flags (micro-batch
// and accumulation, an absent bf16/fp16 section). FAILED_PRECONDITION when a hidden-size "auto" is
// left (FillModelAutos first), naming the key; INVALID_ARGUMENT for a document of the wrong shape
// (one no resolver wrote): not an object, a size that is not an integer, betas not a pair.
absl::StatusOr<DeepSpeedConfig> ReadResolvedDeepSpeedConfig(const nlohmann::json& resolved,
                                                            const DeepSpeedInputs& in);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_DEEPSPEED_CONFIG_H_
