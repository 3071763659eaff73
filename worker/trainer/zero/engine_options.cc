// The engine's options from a job's DeepSpeed config and training arguments.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::zero {

using trainctl::v1::TrainingArguments;

EngineOptions EngineOptionsFrom(const std::optional<DeepSpeedConfig>& ds,
                                const TrainingArguments& t, std::vector<std::string>* warnings) {
  // One source per value (common/deepspeed_config.h): the resolved DeepSpeed config when there
  // is one, else the training arguments.
  EngineOptions o;
  // The optimizer's settings from the training arguments (no config, or one without "optimizer").
  auto optimizer_from_arguments = [&o, &t] {
    o.lr = t.learning_rate();
    o.beta1 = t.adam_beta1();
    o.beta2 = t.adam_beta2();
    o.eps = t.adam_epsilon();
    o.weight_decay = t.weight_decay();
  };
  if (!ds.has_value()) {
    o.compute_dtype = t.bf16() ? torch::kBFloat16 : t.fp16() ? torch::kHalf : torch::kFloat32;
    o.fp16 = t.fp16();
    optimizer_from_arguments();
    o.gradient_clipping = t.max_grad_norm();
    return o;
  }

  // The sizes HF derives from the model's hidden size were filled on this rank (FillModelAutos);
  // ReadResolvedDeepSpeedConfig refuses a document that still has them "auto".
  o.stage = ds->stage;
  o.reduce_bucket_size = ds->reduce_bucket_size.value();
  o.prefetch_bucket_size = ds->stage3_prefetch_bucket_size.value();
  o.param_persistence_threshold = ds->stage3_param_persistence_threshold.value();
  o.max_live_parameters = ds->stage3_max_live_parameters;
  o.overlap_comm = ds->overlap_comm;
  o.offload_optimizer = ds->stage >= 1 && ds->offload_optimizer.device == OffloadDevice::kCpu;
  o.offload_param = ds->stage == 3 && ds->offload_param.device == OffloadDevice::kCpu;
  o.pin_memory = (o.offload_optimizer && ds->offload_optimizer.pin_memory) ||
                 (o.offload_param && ds->offload_param.pin_memory);
  o.gradient_clipping = ds->gradient_clipping;  // "auto" <- max_grad_norm
  if (ds->bf16_enabled) {
    o.compute_dtype = torch::kBFloat16;
    o.fp16 = false;
  } else if (ds->fp16.enabled) {
    o.compute_dtype = torch::kHalf;
    o.fp16 = true;
    o.static_loss_scale = ds->fp16.loss_scale;
    o.initial_scale_power = ds->fp16.initial_scale_power;
    o.loss_scale_window = ds->fp16.loss_scale_window;
    o.hysteresis = ds->fp16.hysteresis;
    o.min_loss_scale = ds->fp16.min_loss_scale;
  } else {
    o.compute_dtype = torch::kFloat32;
    o.fp16 = false;
  }
  // The optimizer: the config's section ("auto" <- the flags), else the training arguments.
  if (ds->optimizer.has_value()) {
    o.lr = ds->optimizer->lr;
    o.beta1 = ds->optimizer->betas[0];
    o.beta2 = ds->optimizer->betas[1];
    o.eps = ds->optimizer->eps;
    o.weight_decay = ds->optimizer->weight_decay;
    o.adam_w_mode = ds->optimizer->adam_w_mode;
  } else {
    optimizer_from_arguments();
  }
  if (warnings != nullptr) {
    if (!ds->contiguous_gradients) {
      warnings->push_back(
          "deepspeed.zero_optimization.contiguous_gradients: false is ignored; each unit's "
          "gradients always live in one contiguous buffer");
    }
    if (ds->scheduler.has_value()) {
      warnings->push_back(
          "deepspeed.scheduler: ignored; trainctl's engine takes the learning-rate schedule from "
          "the job's lr_scheduler_type");
    }
  }
  return o;
}

}  // namespace trainctl::zero
