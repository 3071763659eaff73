#include "common/internal/deepspeed_keys.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl::deepspeed_internal {

using nlohmann::json;

namespace {
constexpr absl::string_view kAuto = "auto";
}  // namespace

// JSON value helpers.

std::string Show(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

bool IsAuto(const json& value) {
  return value.is_string() && value.get_ref<const std::string&>() == kAuto;
}

// An integer, or an integral float such as 1e9 (DeepSpeed accepts both for sizes and counts).
std::optional<int64_t> AsInt(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (!value.is_number_float()) return std::nullopt;
  const double d = value.get<double>();
  if (!std::isfinite(d) || d != std::trunc(d) || std::fabs(d) >= 9.2e18) return std::nullopt;
  return static_cast<int64_t>(d);
}

std::optional<double> AsReal(const json& value) {
  if (!value.is_number()) return std::nullopt;
  const double d = value.get<double>();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

namespace {

constexpr KeySpec kKeys[] = {
    {"train_batch_size", Kind::kPositiveCount, Handling::kHonoured, true},
    {"train_micro_batch_size_per_gpu", Kind::kPositiveCount, Handling::kHonoured, true},
    {"gradient_accumulation_steps", Kind::kPositiveCount, Handling::kHonoured, true},
    {"gradient_clipping", Kind::kReal, Handling::kHonoured, true},
    {"steps_per_print", Kind::kPositiveCount},
    {"wall_clock_breakdown", Kind::kBool},
    {"zero_allow_untested_optimizer", Kind::kBool},
    {"prescale_gradients", Kind::kBool},
    {"gradient_predivide_factor", Kind::kPositiveReal},
    {"zero_optimization", Kind::kSection},
    {"zero_optimization.stage", Kind::kStage},
    {"zero_optimization.offload_optimizer", Kind::kSection},
    {"zero_optimization.offload_optimizer.device", Kind::kOffloadDevice},
    {"zero_optimization.offload_optimizer.pin_memory", Kind::kBool},
    {"zero_optimization.offload_param", Kind::kSection},
    {"zero_optimization.offload_param.device", Kind::kOffloadDevice},
    {"zero_optimization.offload_param.pin_memory", Kind::kBool},
    {"zero_optimization.overlap_comm", Kind::kBool},
    {"zero_optimization.contiguous_gradients", Kind::kBool},
    {"zero_optimization.sub_group_size", Kind::kCount},
    {"zero_optimization.reduce_bucket_size", Kind::kCount, Handling::kHonoured, true},
    {"zero_optimization.reduce_scatter", Kind::kBool},
    {"zero_optimization.allgather_partitions", Kind::kBool},
    {"zero_optimization.allgather_bucket_size", Kind::kCount},
    {"zero_optimization.stage3_prefetch_bucket_size", Kind::kCount, Handling::kHonoured, true},
    {"zero_optimization.stage3_param_persistence_threshold", Kind::kCount, Handling::kHonoured,
     true},
    {"zero_optimization.stage3_max_live_parameters", Kind::kCount},
    {"zero_optimization.stage3_max_reuse_distance", Kind::kCount},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", Kind::kBool},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", Kind::kBool, Handling::kAlias,
     false, "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    {"zero_optimization.cpu_offload", Kind::kBool, Handling::kRejectIfEnabled, false,
     "deprecated and not read by trainctl; use zero_optimization.offload_optimizer"},
    {"zero_optimization.cpu_offload_param", Kind::kBool, Handling::kRejectIfEnabled, false,
     "deprecated and not read by trainctl; use zero_optimization.offload_param"},
    {"fp16", Kind::kSection},
    {"fp16.enabled", Kind::kBool, Handling::kHonoured, true},
    {"fp16.auto_cast", Kind::kBool},
    {"fp16.loss_scale", Kind::kReal},
    {"fp16.initial_scale_power", Kind::kCount},
    {"fp16.loss_scale_window", Kind::kPositiveCount},
    {"fp16.hysteresis", Kind::kCount},
    {"fp16.consecutive_hysteresis", Kind::kBool},
    {"fp16.min_loss_scale", Kind::kPositiveReal},
    {"bf16", Kind::kSection},
    {"bf16.enabled", Kind::kBool, Handling::kHonoured, true},
    {"bfloat16", Kind::kSection, Handling::kRejectIfEnabled, false,
     "deprecated alias not read by trainctl; rename it to \"bf16\""},
    {"amp", Kind::kSection, Handling::kRejectIfEnabled, false,
     "apex amp is not supported by trainctl; use fp16 or bf16"},
    {"elasticity", Kind::kSection, Handling::kRejectIfEnabled, false,
     "not supported by trainctl; the batch size comes from the job's flags"},
    {"optimizer", Kind::kSection},
    {"optimizer.type", Kind::kOptimizerType},
    {"optimizer.params", Kind::kSection},
    {"optimizer.params.lr", Kind::kReal, Handling::kHonoured, true},
    {"optimizer.params.betas", Kind::kBetas, Handling::kHonoured, true},
    {"optimizer.params.eps", Kind::kReal, Handling::kHonoured, true},
    {"optimizer.params.weight_decay", Kind::kReal, Handling::kHonoured, true},
    {"optimizer.params.adam_w_mode", Kind::kBool},
    {"optimizer.params.amsgrad", Kind::kBool, Handling::kRejectIfEnabled, false,
     "not supported by trainctl; DeepSpeed's Adam has no AMSGrad variant"},
    {"scheduler", Kind::kSection},
    {"scheduler.type", Kind::kSchedulerType},
    {"scheduler.params", Kind::kSection},
    {"scheduler.params.warmup_min_lr", Kind::kReal, Handling::kHonoured, true},
    {"scheduler.params.warmup_max_lr", Kind::kReal, Handling::kHonoured, true},
    {"scheduler.params.warmup_num_steps", Kind::kCount, Handling::kHonoured, true},
    {"scheduler.params.total_num_steps", Kind::kPositiveCount, Handling::kHonoured, true},
    {"scheduler.params.warmup_type", Kind::kWarmupType},
    {"scheduler.params.warmup_min_ratio", Kind::kRatio},
    {"scheduler.params.cos_min_ratio", Kind::kRatio},
    {"activation_checkpointing", Kind::kSection},
    {"activation_checkpointing.partition_activations", Kind::kBool},
    {"activation_checkpointing.cpu_checkpointing", Kind::kBool},
    {"activation_checkpointing.contiguous_memory_optimization", Kind::kBool},
    {"activation_checkpointing.number_checkpoints", Kind::kCountOrNull},
    {"activation_checkpointing.synchronize_checkpoint_boundary", Kind::kBool},
    {"activation_checkpointing.profile", Kind::kBool},
};

// DeepSpeed keys trainctl's trainer does not implement and can safely ignore.
constexpr absl::string_view kIgnoredKeys[] = {
    "flops_profiler",
    "comms_logger",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "autotuning",
    "compression_training",
    "data_efficiency",
    "curriculum_learning",
    "checkpoint",
    "aio",
    "data_types",
    "pipeline",
    "sparse_attention",
    "quantize_training",
    "dump_state",
    "memory_breakdown",
    "sparse_gradients",
    "communication_data_type",
    "seq_parallel_communication_data_type",
    "fp32_allreduce",
    "disable_allgather",
    "zero_force_ds_cpu_optimizer",
    "eigenvalue",
    "progressive_layer_drop",
    "hybrid_engine",
    "compile",
    "nebula",
    "weight_quantization",
    "timers",
    "graph_harvesting",
    "torch_autocast",
    "tensor_parallel",
    "dataloader_drop_last",
    "use_data_before_expert_parallel_",
    "zero_optimization.load_from_fp32_weights",
    "zero_optimization.elastic_checkpoint",
    "zero_optimization.ignore_unused_parameters",
    "zero_optimization.legacy_stage1",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_optimization.zero_quantized_gradients",
    "zero_optimization.zeropp_loco_param",
    "zero_optimization.mics_shard_size",
    "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.memory_efficient_linear",
    "zero_optimization.pipeline_loading_checkpoint",
    "zero_optimization.override_module_apply",
    "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params",
    "zero_optimization.cpu_offload_use_pin_memory",
    "zero_optimization.log_trace_cache_warnings",
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size",
    "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.buffer_count",
    "zero_optimization.offload_optimizer.pipeline_read",
    "zero_optimization.offload_optimizer.pipeline_write",
    "zero_optimization.offload_optimizer.fast_init",
    "zero_optimization.offload_optimizer.ratio",
    "fp16.fp16_master_weights_and_grads",
    "bf16.immediate_grad_update",
    "bf16.check_grad_overflow",
    "bf16.bf16_master_weights_and_grads",
    "bf16.bf16_optimizer_states",
    "optimizer.params.torch_adam",
    "optimizer.params.bias_correction",
    "scheduler.params.last_batch_iteration",
};

// fp16 dynamic-loss-scaling keys, which configs copied from fp16 ones often carry in their bf16
// section (bf16 on or off).
constexpr absl::string_view kBf16LossScalingKeys[] = {
    "bf16.loss_scale", "bf16.initial_scale_power",    "bf16.loss_scale_window",
    "bf16.hysteresis", "bf16.consecutive_hysteresis", "bf16.min_loss_scale",
};

}  // namespace

std::optional<KeySpec> FindKey(absl::string_view path) {
  for (const KeySpec& spec : kKeys) {
    if (spec.path == path) return spec;
  }
  for (absl::string_view key : kIgnoredKeys) {
    if (key == path) return KeySpec{key, Kind::kSection, Handling::kIgnored};
  }
  for (absl::string_view key : kBf16LossScalingKeys) {
    if (key == path) return KeySpec{key, Kind::kSection, Handling::kFp16Only};
  }
  return std::nullopt;
}

bool ListContains(absl::string_view list, absl::string_view value, bool ignore_case) {
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    if (ignore_case ? absl::EqualsIgnoreCase(item, value) : item == value) return true;
  }
  return false;
}

// Per-key validation.

namespace {

struct EnumChoices {
  absl::string_view supported;    // comma-separated
  absl::string_view unsupported;  // values DeepSpeed has that trainctl cannot run, comma-separated
  bool ignore_case;
};

const EnumChoices* ChoicesFor(Kind kind) {
  static constexpr EnumChoices kDevice{"cpu,none", "nvme,hpu", false};
  static constexpr EnumChoices kOptimizer{
      "Adam,AdamW", "OneBitAdam,ZeroOneAdam,OneBitLamb,Lamb,Lion,MuAdam,MuAdamW,MuSGD,Adagrad",
      true};
  static constexpr EnumChoices kScheduler{"WarmupLR,WarmupDecayLR,WarmupCosineLR",
                                          "LRRangeTest,OneCycle", false};
  static constexpr EnumChoices kWarmup{"log,linear", "", false};
  switch (kind) {
    case Kind::kOffloadDevice:
      return &kDevice;
    case Kind::kOptimizerType:
      return &kOptimizer;
    case Kind::kSchedulerType:
      return &kScheduler;
    case Kind::kWarmupType:
      return &kWarmup;
    default:
      return nullptr;
  }
}

std::string QuotedList(absl::string_view list) {
  std::vector<std::string> quoted;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    quoted.push_back(absl::StrCat("\"", item, "\""));
  }
  return absl::StrJoin(quoted, ",");
}

std::optional<std::string> EnumError(const EnumChoices& choices, const json& value) {
  const std::string one_of = QuotedList(choices.supported);
  if (!value.is_string()) return absl::StrCat("must be one of ", one_of, ", got ", Show(value));
  const std::string& s = value.get_ref<const std::string&>();
  if (ListContains(choices.supported, s, choices.ignore_case)) return std::nullopt;
  if (ListContains(choices.unsupported, s, choices.ignore_case)) {
    return absl::StrCat(Show(value), " is not supported by trainctl; use one of ", one_of);
  }
  return absl::StrCat("must be one of ", one_of, ", got ", Show(value));
}

bool InRange(std::optional<double> d, double lo, double hi_exclusive) {
  return d.has_value() && *d >= lo && *d < hi_exclusive;
}

std::optional<std::string> BetasError(const json& value) {
  if (value.is_array() && value.size() == 2 && InRange(AsReal(value[0]), 0, 1) &&
      InRange(AsReal(value[1]), 0, 1)) {
    return std::nullopt;
  }
  return absl::StrCat("must be [beta1, beta2] with each in [0, 1), got ", Show(value));
}

// Why `value` is not of `kind`, or nullopt when it is.
std::optional<std::string> KindError(Kind kind, const json& value) {
  const std::optional<int64_t> i = AsInt(value);
  const std::optional<double> d = AsReal(value);
  auto fail = [&](absl::string_view what) -> std::optional<std::string> {
    return absl::StrCat("must be ", what, ", got ", Show(value));
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  switch (kind) {
    case Kind::kSection:
      return value.is_object() ? std::nullopt : fail("an object");
    case Kind::kBool:
      return value.is_boolean() ? std::nullopt : fail("true or false");
    case Kind::kCount:
      return i && *i >= 0 ? std::nullopt : fail("a non-negative integer");
    case Kind::kPositiveCount:
      return i && *i >= 1 ? std::nullopt : fail("a positive integer");
    case Kind::kCountOrNull:
      return value.is_null() || (i && *i >= 1) ? std::nullopt : fail("a positive integer or null");
    case Kind::kReal:
      return InRange(d, 0, kInf) ? std::nullopt : fail("a non-negative number");
    case Kind::kPositiveReal:
      return InRange(d, 0, kInf) && *d > 0 ? std::nullopt : fail("a positive number");
    case Kind::kRatio:
      return InRange(d, 0, 1) || d == 1.0 ? std::nullopt : fail("a number in [0, 1]");
    case Kind::kBetas:
      return BetasError(value);
    case Kind::kStage:
      return i && *i >= 0 && *i <= 3 ? std::nullopt : fail("one of 0,1,2,3");
    default:
      return EnumError(*ChoicesFor(kind), value);
  }
}

bool IsEnabled(const json& value) {
  if (value.is_boolean()) return value.get<bool>();
  if (!value.is_object()) return false;
  auto it = value.find("enabled");
  return it != value.end() && *it == true;
}

void CheckValue(const KeySpec& spec, const std::string& path, const json& value,
                Diagnostics& diag) {
  if (IsAuto(value)) {
    if (!spec.auto_ok) diag.Error(path, "\"auto\" is not resolvable for this key");
    return;
  }
  if (std::optional<std::string> why = KindError(spec.kind, value)) {
    diag.Error(path, *why);
  } else if (spec.kind == Kind::kSection) {
    CheckSection(value, path, diag);
  }
}

void CheckKey(const std::string& path, const json& value, Diagnostics& diag) {
  const std::optional<KeySpec> spec = FindKey(path);
  if (!spec.has_value()) return diag.Warn(path, "unknown key; ignored");
  switch (spec->handling) {
    case Handling::kIgnored:
      return diag.Warn(path, "not supported by trainctl; ignored");
    case Handling::kFp16Only:
      return diag.Warn(path, "only used by fp16 dynamic loss scaling; ignored in the bf16 section");
    case Handling::kRejectIfEnabled:
      if (IsEnabled(value)) {
        return diag.Error(path, spec->note);
      }
      return diag.Warn(path, "not supported by trainctl; ignored");
    case Handling::kAlias:
      diag.Warn(path, absl::StrCat("deprecated alias of ", spec->note));
      break;
    case Handling::kHonoured:
      break;
  }
  CheckValue(*spec, path, value, diag);
}

}  // namespace

void CheckSection(const json& section, absl::string_view prefix, Diagnostics& diag) {
  for (const auto& item : section.items()) {
    const std::string path = prefix.empty() ? item.key() : absl::StrCat(prefix, ".", item.key());
    CheckKey(path, item.value(), diag);
  }
}

}  // namespace trainctl::deepspeed_internal
