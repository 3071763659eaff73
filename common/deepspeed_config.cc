#include "common/deepspeed_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/internal/deepspeed_keys.h"
#include "common/status_macros.h"

namespace trainctl {
namespace {

using deepspeed_internal::AsInt;
using deepspeed_internal::AsReal;
using deepspeed_internal::CheckSection;
using deepspeed_internal::Diagnostics;
using deepspeed_internal::FindKey;
using deepspeed_internal::Handling;
using deepspeed_internal::IsAuto;
using deepspeed_internal::KeySpec;
using deepspeed_internal::ListContains;
using deepspeed_internal::Show;
using nlohmann::json;

// The value at the dotted `path`, or nullptr when it, or an object on the way, is absent.
const json* Find(const json& root, absl::string_view path) {
  const json* node = &root;
  for (absl::string_view key : absl::StrSplit(path, '.')) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(std::string(key));
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

json* FindMutable(json& root, absl::string_view path) {
  return const_cast<json*>(Find(static_cast<const json&>(root), path));
}

bool GetBool(const json& doc, absl::string_view path, bool fallback) {
  const json* v = Find(doc, path);
  return v != nullptr && v->is_boolean() ? v->get<bool>() : fallback;
}

int64_t GetInt(const json& doc, absl::string_view path, int64_t fallback) {
  const json* v = Find(doc, path);
  if (v == nullptr) return fallback;
  return AsInt(*v).value_or(fallback);
}

// nullopt when the value is an unresolved "auto".
std::optional<int64_t> GetIntOrAuto(const json& doc, absl::string_view path,
                                    std::optional<int64_t> fallback) {
  const json* v = Find(doc, path);
  if (v == nullptr) return fallback;
  if (IsAuto(*v)) return std::nullopt;
  return AsInt(*v);
}

double GetReal(const json& doc, absl::string_view path, double fallback) {
  const json* v = Find(doc, path);
  if (v == nullptr) return fallback;
  return AsReal(*v).value_or(fallback);
}

std::string GetString(const json& doc, absl::string_view path, absl::string_view fallback) {
  const json* v = Find(doc, path);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string(fallback);
}

// "auto" resolution and agreement with the job's flags.

// The keys HF's integration derives from the model's hidden size h, with their values:
// reduce_bucket_size h*h, stage3_prefetch_bucket_size int(0.9*h*h) (HF's evaluation order),
// stage3_param_persistence_threshold 10*h.
std::vector<std::pair<std::string, int64_t>> HiddenSizeValues(int64_t h) {
  return {{"zero_optimization.reduce_bucket_size", h * h},
          {"zero_optimization.stage3_prefetch_bucket_size",
           static_cast<int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h))},
          {"zero_optimization.stage3_param_persistence_threshold", 10 * h}};
}

struct Resolution {
  const DeepSpeedInputs& in;
  json& doc;
  Diagnostics& diag;
};

// HF's fill_match: an "auto" at `path` becomes `value`; with a non-empty `flag`, an explicit value
// must equal it (fill_only otherwise). With no `value` yet, "auto" stays and `deferred` is warned.
void FillAuto(Resolution& r, absl::string_view path, const std::optional<json>& value,
              absl::string_view flag, absl::string_view deferred = "") {
  json* node = FindMutable(r.doc, path);
  if (node == nullptr || r.diag.HasError(path)) return;
  if (!value.has_value()) {
    if (IsAuto(*node)) r.diag.Warn(path, deferred);
    return;
  }
  if (IsAuto(*node)) {
    *node = *value;
  } else if (!flag.empty() && *node != *value) {
    r.diag.Error(path, absl::StrCat(Show(*node), " disagrees with ", flag, " ", Show(*value)));
  }
}

void ResolveBatch(Resolution& r) {
  const DeepSpeedInputs& in = r.in;
  FillAuto(r, "train_micro_batch_size_per_gpu", json(in.micro_batch),
           "--per_device_train_batch_size");
  FillAuto(r, "gradient_accumulation_steps", json(in.grad_accum), "--gradient_accumulation_steps");
  const int64_t global = int64_t{in.world_size} * in.micro_batch * in.grad_accum;
  json* tbs = FindMutable(r.doc, "train_batch_size");
  if (tbs == nullptr || IsAuto(*tbs)) {
    r.doc["train_batch_size"] = global;
  } else if (!r.diag.HasError("train_batch_size") && *tbs != json(global)) {
    r.diag.Error("train_batch_size",
                 absl::StrCat(Show(*tbs), " != train_micro_batch_size_per_gpu ", in.micro_batch,
                              " * gradient_accumulation_steps ", in.grad_accum,
                              " * data-parallel world_size ", in.world_size, " = ", global));
  }
  FillAuto(r, "gradient_clipping", json(in.max_grad_norm), "--max_grad_norm");
  if (Find(r.doc, "gradient_clipping") == nullptr && in.max_grad_norm > 0) {
    r.diag.Warn("gradient_clipping",
                absl::StrCat("absent, so gradients are not clipped although --max_grad_norm is ",
                             in.max_grad_norm));
  }
}

// Whether `section` ("bf16"/"fp16") ends up enabled. An absent section follows the flag, as
// accelerate adds {"enabled": true} for it; a section without "enabled" is off, DeepSpeed's
// default.
bool PrecisionEnabled(const json& doc, absl::string_view section, bool flag) {
  if (Find(doc, section) == nullptr) return flag;
  return GetBool(doc, absl::StrCat(section, ".enabled"), false);
}

void ResolvePrecision(Resolution& r) {
  for (auto [section, flag] : {std::pair<absl::string_view, bool>{"fp16", r.in.fp16},
                               std::pair<absl::string_view, bool>{"bf16", r.in.bf16}}) {
    const std::string path = absl::StrCat(section, ".enabled");
    FillAuto(r, path, json(flag), absl::StrCat("--", section));
    const json* node = Find(r.doc, section);
    if (flag && node != nullptr && node->is_object() && Find(r.doc, path) == nullptr) {
      r.diag.Warn(
          path, absl::StrCat("absent, so ", section, " stays off although --", section, " is set"));
    }
  }
  if (PrecisionEnabled(r.doc, "bf16", r.in.bf16) && PrecisionEnabled(r.doc, "fp16", r.in.fp16)) {
    r.diag.Error("bf16.enabled", "bf16 and fp16 cannot both be enabled");
  }
}

void RequireType(Resolution& r, absl::string_view section) {
  const json* node = Find(r.doc, section);
  if (node != nullptr && node->is_object() && !node->contains("type")) {
    r.diag.Error(absl::StrCat(section, ".type"),
                 absl::StrCat("required when the ", section, " section is present"));
  }
}

void ResolveOptimizer(Resolution& r) {
  const DeepSpeedInputs& in = r.in;
  FillAuto(r, "optimizer.params.lr", json(in.learning_rate), "--learning_rate");
  FillAuto(r, "optimizer.params.betas", json::array({in.adam_beta1, in.adam_beta2}),
           "--adam_beta1/--adam_beta2");
  FillAuto(r, "optimizer.params.eps", json(in.adam_epsilon), "--adam_epsilon");
  FillAuto(r, "optimizer.params.weight_decay", json(in.weight_decay), "--weight_decay");
  RequireType(r, "optimizer");
}

std::optional<json> OptionalJson(const std::optional<int64_t>& value) {
  if (!value.has_value()) return std::nullopt;
  return json(*value);
}

// The parameters DeepSpeed's constructor of each scheduler takes.
absl::string_view SchedulerParams(absl::string_view type) {
  if (type == "WarmupLR") {
    return "warmup_min_lr,warmup_max_lr,warmup_num_steps,warmup_type,last_batch_iteration";
  }
  if (type == "WarmupDecayLR") {
    return "warmup_min_lr,warmup_max_lr,warmup_num_steps,warmup_type,last_batch_iteration,"
           "total_num_steps";
  }
  return "total_num_steps,warmup_min_ratio,warmup_num_steps,warmup_type,cos_min_ratio,"
         "last_batch_iteration";
}

void CheckSchedulerParams(Resolution& r) {
  const json* type = Find(r.doc, "scheduler.type");
  if (type == nullptr || r.diag.HasError("scheduler.type") || r.diag.HasError("scheduler.params")) {
    return;
  }
  const std::string name = type->get<std::string>();
  const absl::string_view takes = SchedulerParams(name);
  if (const json* params = Find(r.doc, "scheduler.params")) {
    for (const auto& item : params->items()) {
      const std::string path = absl::StrCat("scheduler.params.", item.key());
      if (FindKey(path).has_value() && !ListContains(takes, item.key(), false)) {
        r.diag.Warn(path, absl::StrCat("not a ", name, " parameter; ignored"));
      }
    }
  }
  if (name != "WarmupLR" && Find(r.doc, "scheduler.params.total_num_steps") == nullptr) {
    r.diag.Error("scheduler.params.total_num_steps", absl::StrCat("required by ", name));
  }
}

void ResolveScheduler(Resolution& r) {
  constexpr absl::string_view kDeferred =
      "\"auto\" left for the trainer, which resolves it once the run's step count is known";
  FillAuto(r, "scheduler.params.warmup_min_lr", json(0), "");
  FillAuto(r, "scheduler.params.warmup_max_lr", json(r.in.learning_rate), "--learning_rate");
  FillAuto(r, "scheduler.params.total_num_steps", OptionalJson(r.in.total_steps),
           "the run's total step count", kDeferred);
  FillAuto(r, "scheduler.params.warmup_num_steps", OptionalJson(r.in.warmup_steps),
           "--warmup_steps", kDeferred);
  RequireType(r, "scheduler");
  CheckSchedulerParams(r);
}

// HF derives these from the model's hidden size (fill_only: explicit values stand).
void ResolveHiddenSizeKeys(Resolution& r) {
  constexpr absl::string_view kDeferred =
      "\"auto\" left for the trainer, which derives it from hidden_size in the model's config.json";
  for (const auto& [path, value] : HiddenSizeValues(r.in.hidden_size.value_or(0))) {
    FillAuto(r, path, r.in.hidden_size ? std::optional<json>(value) : std::nullopt, "", kDeferred);
  }
}

// Rules across keys.

bool OffloadsTo(const json& doc, absl::string_view path) {
  return GetString(doc, absl::StrCat(path, ".device"), "none") != "none";
}

// DeepSpeed reads stage-3 keys only at stage 3, and optimizer offload only at stages 1-3.
void CheckStageScopedKeys(const json& doc, Diagnostics& diag) {
  const int64_t stage = GetInt(doc, "zero_optimization.stage", 0);
  const std::string at_stage = absl::StrCat("; ignored at stage ", stage);
  if (stage < 3) {
    if (const json* zero = Find(doc, "zero_optimization"); zero != nullptr && zero->is_object()) {
      for (const auto& item : zero->items()) {
        const std::string path = absl::StrCat("zero_optimization.", item.key());
        const std::optional<KeySpec> spec = FindKey(path);
        if (absl::StartsWith(item.key(), "stage3_") && spec.has_value() &&
            spec->handling != Handling::kIgnored) {
          diag.Warn(path, absl::StrCat("only used by ZeRO stage 3", at_stage));
        }
      }
    }
    if (OffloadsTo(doc, "zero_optimization.offload_param")) {
      diag.Warn("zero_optimization.offload_param",
                absl::StrCat("only used by ZeRO stage 3", at_stage));
    }
  }
  if (stage == 0 && OffloadsTo(doc, "zero_optimization.offload_optimizer")) {
    diag.Warn("zero_optimization.offload_optimizer",
              absl::StrCat("only used by ZeRO stages 1-3", at_stage));
  }
}

void CheckGatherAlias(const json& doc, Diagnostics& diag) {
  constexpr absl::string_view kAlias = "zero_optimization.stage3_gather_fp16_weights_on_model_save";
  const json* alias = Find(doc, kAlias);
  const json* key = Find(doc, "zero_optimization.stage3_gather_16bit_weights_on_model_save");
  if (alias != nullptr && key != nullptr && *alias != *key) {
    diag.Error(kAlias,
               "disagrees with zero_optimization.stage3_gather_16bit_weights_on_model_save");
  }
}

// DeepSpeed's checkpointing.configure() asserts these.
void CheckActivationCheckpointing(const json& doc, Diagnostics& diag) {
  constexpr absl::string_view kContiguous =
      "activation_checkpointing.contiguous_memory_optimization";
  if (!GetBool(doc, kContiguous, false)) return;
  if (!GetBool(doc, "activation_checkpointing.partition_activations", false)) {
    diag.Error(kContiguous, "requires activation_checkpointing.partition_activations true");
  }
  const json* number = Find(doc, "activation_checkpointing.number_checkpoints");
  if (number == nullptr || number->is_null()) {
    diag.Error(kContiguous, "requires activation_checkpointing.number_checkpoints");
  }
}

// The typed view of a resolved, error-free document.

DeepSpeedOffload ReadOffload(const json& doc, absl::string_view path) {
  DeepSpeedOffload offload;
  if (OffloadsTo(doc, path)) offload.device = OffloadDevice::kCpu;
  offload.pin_memory = GetBool(doc, absl::StrCat(path, ".pin_memory"), false);
  return offload;
}

void ReadZero(const json& doc, DeepSpeedConfig& c) {
  constexpr absl::string_view z = "zero_optimization.";
  auto key = [&](absl::string_view name) { return absl::StrCat(z, name); };
  c.stage = static_cast<int>(GetInt(doc, key("stage"), 0));
  c.offload_optimizer = ReadOffload(doc, key("offload_optimizer"));
  if (c.stage == 0) c.offload_optimizer.device = OffloadDevice::kNone;
  c.offload_param = ReadOffload(doc, key("offload_param"));
  if (c.stage < 3) c.offload_param.device = OffloadDevice::kNone;
  c.overlap_comm = GetBool(doc, key("overlap_comm"), c.stage == 3);
  c.contiguous_gradients = GetBool(doc, key("contiguous_gradients"), c.contiguous_gradients);
  c.reduce_scatter = GetBool(doc, key("reduce_scatter"), c.reduce_scatter);
  c.allgather_partitions = GetBool(doc, key("allgather_partitions"), c.allgather_partitions);
  c.allgather_bucket_size = GetInt(doc, key("allgather_bucket_size"), c.allgather_bucket_size);
  c.sub_group_size = GetInt(doc, key("sub_group_size"), c.sub_group_size);
  c.reduce_bucket_size = GetIntOrAuto(doc, key("reduce_bucket_size"), c.reduce_bucket_size);
  c.stage3_prefetch_bucket_size =
      GetIntOrAuto(doc, key("stage3_prefetch_bucket_size"), c.stage3_prefetch_bucket_size);
  c.stage3_param_persistence_threshold = GetIntOrAuto(
      doc, key("stage3_param_persistence_threshold"), c.stage3_param_persistence_threshold);
  c.stage3_max_live_parameters =
      GetInt(doc, key("stage3_max_live_parameters"), c.stage3_max_live_parameters);
  c.stage3_max_reuse_distance =
      GetInt(doc, key("stage3_max_reuse_distance"), c.stage3_max_reuse_distance);
  c.stage3_gather_16bit_weights_on_model_save =
      GetBool(doc, key("stage3_gather_16bit_weights_on_model_save"),
              GetBool(doc, key("stage3_gather_fp16_weights_on_model_save"), false));
}

void ReadPrecision(const json& doc, const DeepSpeedInputs& in, DeepSpeedConfig& c) {
  c.bf16_enabled = PrecisionEnabled(doc, "bf16", in.bf16);
  DeepSpeedFp16& f = c.fp16;
  f.enabled = PrecisionEnabled(doc, "fp16", in.fp16);
  // accelerate adds {"enabled": true, "auto_cast": true} when --fp16 meets no fp16 section.
  f.auto_cast = GetBool(doc, "fp16.auto_cast", Find(doc, "fp16") == nullptr && in.fp16);
  f.loss_scale = GetReal(doc, "fp16.loss_scale", f.loss_scale);
  f.initial_scale_power = GetInt(doc, "fp16.initial_scale_power", f.initial_scale_power);
  f.loss_scale_window = GetInt(doc, "fp16.loss_scale_window", f.loss_scale_window);
  f.hysteresis = GetInt(doc, "fp16.hysteresis", f.hysteresis);
  f.consecutive_hysteresis = GetBool(doc, "fp16.consecutive_hysteresis", f.consecutive_hysteresis);
  f.min_loss_scale = GetReal(doc, "fp16.min_loss_scale", f.min_loss_scale);
}

DeepSpeedActivationCheckpointing ReadActivationCheckpointing(const json& doc) {
  constexpr absl::string_view a = "activation_checkpointing.";
  auto key = [&](absl::string_view name) { return absl::StrCat(a, name); };
  DeepSpeedActivationCheckpointing ac;
  ac.partition_activations = GetBool(doc, key("partition_activations"), false);
  ac.cpu_checkpointing = GetBool(doc, key("cpu_checkpointing"), false);
  ac.contiguous_memory_optimization = GetBool(doc, key("contiguous_memory_optimization"), false);
  ac.number_checkpoints = GetIntOrAuto(doc, key("number_checkpoints"), std::nullopt);
  ac.synchronize_checkpoint_boundary = GetBool(doc, key("synchronize_checkpoint_boundary"), false);
  ac.profile = GetBool(doc, key("profile"), false);
  return ac;
}

std::optional<DeepSpeedOptimizer> ReadOptimizer(const json& doc) {
  if (Find(doc, "optimizer") == nullptr) return std::nullopt;
  DeepSpeedOptimizer o;
  const bool adamw = absl::EqualsIgnoreCase(GetString(doc, "optimizer.type", ""), "AdamW");
  o.type = adamw ? "AdamW" : "Adam";
  o.lr = GetReal(doc, "optimizer.params.lr", o.lr);
  if (const json* betas = Find(doc, "optimizer.params.betas")) {
    o.betas = {(*betas)[0].get<double>(), (*betas)[1].get<double>()};
  }
  o.eps = GetReal(doc, "optimizer.params.eps", o.eps);
  o.weight_decay = GetReal(doc, "optimizer.params.weight_decay", o.weight_decay);
  o.adam_w_mode = adamw || GetBool(doc, "optimizer.params.adam_w_mode", true);
  return o;
}

std::optional<DeepSpeedScheduler> ReadScheduler(const json& doc) {
  if (Find(doc, "scheduler") == nullptr) return std::nullopt;
  constexpr absl::string_view p = "scheduler.params.";
  auto key = [&](absl::string_view name) { return absl::StrCat(p, name); };
  DeepSpeedScheduler s;
  s.type = GetString(doc, "scheduler.type", "");
  s.warmup_min_lr = GetReal(doc, key("warmup_min_lr"), s.warmup_min_lr);
  s.warmup_max_lr = GetReal(doc, key("warmup_max_lr"), s.warmup_max_lr);
  s.warmup_num_steps = GetIntOrAuto(doc, key("warmup_num_steps"), s.warmup_num_steps);
  s.total_num_steps = GetIntOrAuto(doc, key("total_num_steps"), std::nullopt);
  if (s.type == "WarmupLR") s.total_num_steps = std::nullopt;
  s.warmup_type = GetString(doc, key("warmup_type"), s.warmup_type);
  s.warmup_min_ratio = GetReal(doc, key("warmup_min_ratio"), s.warmup_min_ratio);
  s.cos_min_ratio = GetReal(doc, key("cos_min_ratio"), s.cos_min_ratio);
  return s;
}

DeepSpeedConfig BuildConfig(const json& doc, const DeepSpeedInputs& in) {
  DeepSpeedConfig c;
  ReadZero(doc, c);
  ReadPrecision(doc, in, c);
  c.train_batch_size = GetInt(doc, "train_batch_size", 0);
  c.micro_batch = in.micro_batch;
  c.grad_accum = in.grad_accum;
  c.gradient_clipping = GetReal(doc, "gradient_clipping", 0.0);
  c.activation_checkpointing = ReadActivationCheckpointing(doc);
  c.optimizer = ReadOptimizer(doc);
  c.scheduler = ReadScheduler(doc);
  c.steps_per_print = GetInt(doc, "steps_per_print", c.steps_per_print);
  c.wall_clock_breakdown = GetBool(doc, "wall_clock_breakdown", false);
  // The HF Trainer sets this when it builds the optimizer itself.
  c.zero_allow_untested_optimizer =
      GetBool(doc, "zero_allow_untested_optimizer", false) || !c.optimizer.has_value();
  c.prescale_gradients = GetBool(doc, "prescale_gradients", false);
  c.gradient_predivide_factor = GetReal(doc, "gradient_predivide_factor", 1.0);
  return c;
}

// Inputs.

absl::Status ValidateInputs(const DeepSpeedInputs& in) {
  std::vector<std::string> errors;
  auto require = [&errors](bool ok, absl::string_view flag, absl::string_view what, auto got) {
    if (!ok) errors.push_back(absl::StrCat(flag, ": must be ", what, ", got ", got));
  };
  require(in.world_size >= 1, "world_size (data-parallel ranks)", "positive", in.world_size);
  require(in.micro_batch >= 1, "--per_device_train_batch_size", "positive", in.micro_batch);
  require(in.grad_accum >= 1, "--gradient_accumulation_steps", "positive", in.grad_accum);
  require(in.learning_rate >= 0, "--learning_rate", "non-negative", in.learning_rate);
  require(in.max_grad_norm >= 0, "--max_grad_norm", "non-negative", in.max_grad_norm);
  require(in.weight_decay >= 0, "--weight_decay", "non-negative", in.weight_decay);
  require(in.adam_beta1 >= 0 && in.adam_beta1 < 1, "--adam_beta1", "in [0, 1)", in.adam_beta1);
  require(in.adam_beta2 >= 0 && in.adam_beta2 < 1, "--adam_beta2", "in [0, 1)", in.adam_beta2);
  require(in.adam_epsilon >= 0, "--adam_epsilon", "non-negative", in.adam_epsilon);
  if (in.bf16 && in.fp16) errors.push_back("--bf16: cannot be combined with --fp16");
  require(in.hidden_size.value_or(1) >= 1, "hidden_size", "positive", in.hidden_size.value_or(0));
  require(in.total_steps.value_or(1) >= 1, "total_steps", "positive", in.total_steps.value_or(0));
  require(in.warmup_steps.value_or(0) >= 0, "--warmup_steps", "non-negative",
          in.warmup_steps.value_or(0));
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseDeepSpeedJson(std::string_view text, std::string_view source) {
  const absl::string_view name(source.data(), source.size());
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // e.byte counts the characters read, the offending one included.
    const size_t offset = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const std::string_view before = text.substr(0, offset);
    const size_t line = 1 + std::count(before.begin(), before.end(), '\n');
    const size_t line_start = before.rfind('\n');
    const size_t column = line_start == std::string_view::npos ? offset + 1 : offset - line_start;
    const std::string what = e.what();
    const size_t detail = what.find(": ");
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": JSON syntax error at line ", line, ", column ", column, " (byte offset ", offset,
        "): ", detail == std::string::npos ? what : what.substr(detail + 2)));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": invalid JSON: ", e.what()));
  }
}

absl::StatusOr<ResolvedDeepSpeedConfig> ResolveDeepSpeedConfig(nlohmann::json doc,
                                                               const DeepSpeedInputs& in) {
  RETURN_IF_ERROR(ValidateInputs(in));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("deepspeed: the document root must be a JSON object, got ", doc.type_name()));
  }
  Diagnostics diag;
  CheckSection(doc, "", diag);
  json resolved = std::move(doc);
  Resolution r{in, resolved, diag};
  ResolveBatch(r);
  ResolvePrecision(r);
  ResolveOptimizer(r);
  ResolveScheduler(r);
  ResolveHiddenSizeKeys(r);
  CheckStageScopedKeys(resolved, diag);
  CheckGatherAlias(resolved, diag);
  CheckActivationCheckpointing(resolved, diag);
  if (!diag.ok()) return diag.ToStatus();

  ResolvedDeepSpeedConfig out;
  out.config = BuildConfig(resolved, in);
  out.json = std::move(resolved);
  out.warnings = diag.TakeWarnings();
  return out;
}

std::map<std::string, int64_t> FillModelAutos(int64_t hidden_size, nlohmann::json* resolved) {
  std::map<std::string, int64_t> filled;
  for (const auto& [path, value] : HiddenSizeValues(hidden_size)) {
    json* node = FindMutable(*resolved, path);
    if (node == nullptr || !IsAuto(*node)) continue;
    *node = value;
    filled.emplace(path, value);
  }
  return filled;
}

absl::StatusOr<DeepSpeedConfig> ReadResolvedDeepSpeedConfig(const nlohmann::json& resolved,
                                                            const DeepSpeedInputs& in) {
  if (!resolved.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resolved DeepSpeed config: the root must be a JSON object, got ", resolved.type_name()));
  }
  for (const auto& [path, value] : HiddenSizeValues(0)) {
    const json* node = Find(resolved, path);
    if (node != nullptr && IsAuto(*node)) {
      return absl::FailedPreconditionError(
          absl::StrCat("deepspeed.", path, ": still \"auto\"; the model's hidden size fills it"));
    }
  }
  // A document no resolver wrote: what BuildConfig would read past or leave unset.
  if (const json* betas = Find(resolved, "optimizer.params.betas");
      betas != nullptr && !(betas->is_array() && betas->size() == 2)) {
    return absl::InvalidArgumentError(
        "resolved DeepSpeed config: optimizer.params.betas: not a pair of numbers");
  }
  DeepSpeedConfig config;
  try {
    config = BuildConfig(resolved, in);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("resolved DeepSpeed config: ", e.what()));
  }
  for (const auto& [path, value] :
       {std::pair<const char*, const std::optional<int64_t>&>{
            "zero_optimization.reduce_bucket_size", config.reduce_bucket_size},
        {"zero_optimization.stage3_prefetch_bucket_size", config.stage3_prefetch_bucket_size},
        {"zero_optimization.stage3_param_persistence_threshold",
         config.stage3_param_persistence_threshold}}) {
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resolved DeepSpeed config: ", path, ": not an integer"));
    }
  }
  return config;
}

}  // namespace trainctl
