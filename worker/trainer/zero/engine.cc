#include "worker/trainer/zero/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer/model/autocast_state.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/zero/internal/engine_unit.h"

namespace trainctl::zero {

// ---------------------------------------------------------------------------------------------
// Units: internal/engine_unit.h

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

bool DecayExempt(const std::string& name) {
  // HF's default split: no weight decay for biases and normalisation weights.
  return absl::EndsWith(name, ".bias") || absl::StrContains(name, "norm") ||
         absl::StrContains(name, "ln_q");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

Engine::Engine(const EngineOptions& options, Comm* comm, bool frozen)
    : options_(options),
      frozen_(frozen),
      world_comm_(comm),
      comm_(options.zero_group != nullptr ? options.zero_group : comm),
      world_(comm_->world_size()),
      rank_(comm_->rank()) {
  if (options_.tensor_parallel != nullptr && options_.tensor_parallel->size > 1) {
    tp_ = options_.tensor_parallel.get();
  }
  if (frozen_) {
    // Stages 1 and 2 shard only optimizer state and gradients, which a frozen model has none of.
    if (options_.stage < 3) options_.stage = 0;
    options_.fp16 = false;
    options_.offload_optimizer = false;
  } else {
    AdamWOptions adam;
    adam.beta1 = options_.beta1;
    adam.beta2 = options_.beta2;
    adam.eps = options_.eps;
    adam.weight_decay = options_.weight_decay;
    adam.adam_w_mode = options_.adam_w_mode;
    optimizer_ = std::make_unique<ShardedAdamW>(adam);
  }
}

Engine::~Engine() {
  if (model_) model_->SetUnitRunner(nullptr);
}

torch::TensorOptions Engine::MasterOptions() const {
  if (frozen_) {
    // No updates to accumulate: the slice is kept as it runs.
    return torch::TensorOptions()
        .dtype(options_.compute_dtype)
        .device(options_.offload_param ? torch::Device(torch::kCPU) : options_.device);
  }
  torch::TensorOptions o = torch::TensorOptions().dtype(torch::kFloat32);
  if (options_.offload_optimizer || !options_.device.is_cuda()) {
    o = o.device(torch::kCPU);
    if (options_.pin_memory && torch::cuda::is_available()) o = o.pinned_memory(true);
  } else {
    o = o.device(options_.device);
  }
  return o;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const model::Qwen2VLConfig& config,
                                                       const EngineOptions& options, Comm* comm,
                                                       int64_t seed,
                                                       const std::string& weights_dir) {
  return Make(config, options, comm, seed, weights_dir, /*frozen=*/false);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateFrozen(const model::Qwen2VLConfig& config,
                                                             const EngineOptions& options,
                                                             Comm* comm, int64_t seed,
                                                             const std::string& weights_dir) {
  return Make(config, options, comm, seed, weights_dir, /*frozen=*/true);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Make(const model::Qwen2VLConfig& config,
                                                     const EngineOptions& options, Comm* comm,
                                                     int64_t seed, const std::string& weights_dir,
                                                     bool frozen) {
  if (options.stage < 0 || options.stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("zero_optimization.stage: must be 0, 1, 2 or 3, got ", options.stage));
  }
  std::unique_ptr<Engine> engine(new Engine(options, comm, frozen));
  RETURN_IF_ERROR(model::Guarded(
      absl::StrCat("building the model of ", config.source),
      [&] { return engine->Build(config, seed, weights_dir); },
      absl::StatusCode::kResourceExhausted));
  if (frozen) engine->model_->eval();
  return engine;
}

void Engine::AdoptUnit(const std::string& name,
                       const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  torch::NoGradGuard no_grad;
  auto unit = std::make_unique<Unit>();
  Unit& u = *unit;
  u.name = name;
  std::vector<torch::Tensor> flat_parts;
  for (const auto& [pname, p] : params) {
    Unit::Slot slot;
    slot.name = pname;
    slot.param = p;
    slot.shape = p.sizes().vec();
    slot.offset = u.numel;
    slot.numel = p.numel();
    slot.decay = !DecayExempt(pname);
    u.numel += slot.numel;
    flat_parts.push_back(p.detach().reshape({-1}).to(torch::kFloat32));
    u.slots.push_back(std::move(slot));
  }
  const bool sharded = options_.stage >= 1;
  u.shard = sharded ? (u.numel + world_ - 1) / world_ : u.numel;
  u.padded = sharded ? u.shard * world_ : u.numel;
  u.begin = sharded ? rank_ * u.shard : 0;
  if (u.padded > u.numel) {
    flat_parts.push_back(torch::zeros({u.padded - u.numel}, torch::kFloat32));
  }
  torch::Tensor flat = torch::cat(flat_parts);
  flat_parts.clear();
  for (const Unit::Slot& slot : u.slots) {
    if (!slot.decay) continue;
    const int64_t lo = std::max(slot.offset, u.begin);
    const int64_t hi = std::min(slot.offset + slot.numel, u.begin + u.shard);
    if (lo < hi) u.decay_ranges.emplace_back(lo - u.begin, hi - u.begin);
  }
  for (const Unit::Slot& slot : u.slots) {
    if (tp_ == nullptr) break;
    const int64_t lo = std::max(slot.offset, u.begin);
    const int64_t hi = std::min(slot.offset + slot.numel, u.begin + u.shard);
    if (lo >= hi) continue;
    auto& ranges =
        model::TensorParallelDim(slot.name, *tp_) >= 0 ? u.sliced_ranges : u.replicated_ranges;
    ranges.emplace_back(lo - u.begin, hi - u.begin);
  }

  const torch::TensorOptions mopts = MasterOptions();
  u.master = flat.narrow(0, u.begin, u.shard).to(mopts, /*non_blocking=*/false, /*copy=*/true);
  if (optimizer_) u.optimizer_slice = optimizer_->AddSlice(u.shard, mopts);
  if (frozen_) {
    for (Unit::Slot& slot : u.slots) slot.param.set_requires_grad(false);
  }
  if (options_.stage == 3) {
    u.master.set_requires_grad(!frozen_);
    u.persistent = u.numel < options_.param_persistence_threshold;
    if (u.persistent) {
      SetFull(u, flat.to(options_.device, options_.compute_dtype));
      live_numel_ += u.padded;
    } else {
      // The working buffer and the parameters' views of it live as long as the engine; only
      // its bytes come and go (engine_stage3.cc).
      SetFull(u, torch::empty(
                     {u.padded},
                     torch::TensorOptions().dtype(options_.compute_dtype).device(options_.device)));
      FreeWorking(u);
    }
  } else {
    const bool alias = options_.stage == 0 && u.master.scalar_type() == options_.compute_dtype &&
                       u.master.device() == options_.device;
    SetFull(u, alias ? u.master : flat.to(options_.device, options_.compute_dtype));
    if (frozen_) {
      live_numel_ += u.padded;
      peak_live_numel_ = std::max(peak_live_numel_, live_numel_);
      by_name_[name] = unit.get();
      units_.push_back(std::move(unit));
      return;
    }
    u.full_grad = torch::zeros({u.padded}, u.full.options());
    if (options_.stage >= 1) u.grad32 = torch::zeros({u.shard}, mopts);
    for (Unit::Slot& slot : u.slots) {
      slot.param.mutable_grad() = u.full_grad.narrow(0, slot.offset, slot.numel).view(slot.shape);
    }
    live_numel_ += u.padded;
  }
  peak_live_numel_ = std::max(peak_live_numel_, live_numel_);
  by_name_[name] = unit.get();
  units_.push_back(std::move(unit));
}

absl::Status Engine::Build(const model::Qwen2VLConfig& config, int64_t seed,
                           const std::string& weights_dir) {
  torch::manual_seed(seed);
  if (tp_ != nullptr && options_.zero_group == nullptr) {
    return absl::InvalidArgumentError("tensor parallelism needs the ZeRO group (zero_group)");
  }
  if (tp_ != nullptr) RETURN_IF_ERROR(CheckTensorParallelFits(config));
  model_ = std::make_shared<model::Qwen2VLForConditionalGeneration>(
      config, [this](const std::string& unit,
                     const std::vector<std::pair<std::string, torch::Tensor>>& params) {
        // Each unit is built whole from its own seed, then a sliced weight keeps this rank's
        // part: the same weights whatever the group's size.
        if (tp_ != nullptr) {
          torch::NoGradGuard no_grad;
          for (const auto& [name, p] : params) {
            if (model::TensorParallelDim(name, *tp_) < 0) continue;
            torch::Tensor param = p;  // shares the module's parameter
            param.set_data(model::SliceForTensorParallel(name, p.detach(), *tp_));
          }
        }
        AdoptUnit(unit, params);
      });
  if (tp_ != nullptr) model_->SetTensorParallel(options_.tensor_parallel);
  model_->train();
  // Units() order, and the tied head's borrowed embedding.
  std::vector<std::unique_ptr<Unit>> ordered;
  for (const model::ModelUnit& mu : model_->Units()) {
    for (auto& u : units_) {
      if (u && u->name == mu.name) ordered.push_back(std::move(u));
    }
  }
  units_ = std::move(ordered);
  if (options_.stage == 3) {
    for (const model::ModelUnit& mu : model_->Units()) {
      for (const std::string& borrowed : mu.borrowed) {
        for (auto& owner : units_) {
          for (const Unit::Slot& slot : owner->slots) {
            if (slot.name == borrowed) {
              by_name_[mu.name]->borrowed.push_back(owner.get());
              by_name_[mu.name]->borrowed_params.push_back(borrowed);
            }
          }
        }
      }
    }
    runner_ = std::make_unique<Runner>(this);
    model_->SetUnitRunner(runner_.get());
    // Every rank must run every unit (each runs collectives), images or not.
    model_->SetRunVisionAlways(true);
  }
  if (!weights_dir.empty()) {
    // Each rank reads only its slices of each tensor from the memory-mapped files.
    ASSIGN_OR_RETURN(auto ckpt, model::SafetensorsCheckpoint::Open(weights_dir));
    std::map<std::string, std::string> key_of;
    for (const std::string& key : ckpt->names()) key_of[model::ToModelKey(key)] = key;
    torch::NoGradGuard no_grad;
    for (auto& u : units_) {
      for (const Unit::Slot& slot : u->slots) {
        auto it = key_of.find(slot.name);
        if (it == key_of.end()) {
          return absl::NotFoundError(
              absl::StrCat("tensor ", slot.name, " is not in ", ckpt->path()));
        }
        const model::SafetensorInfo* info = ckpt->Find(it->second);
        const std::vector<int64_t> whole =
            tp_ != nullptr ? model::WholeShape(slot.name, slot.shape, *tp_) : slot.shape;
        if (info->shape != whole) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor ", it->second, " in ", ckpt->FileOf(it->second), " has shape ",
                           ShapeString(info->shape), " but the model's ", slot.name, " is ",
                           ShapeString(whole)));
        }
        const int64_t lo = std::max(slot.offset, u->begin);
        const int64_t hi = std::min(slot.offset + slot.numel, u->begin + u->shard);
        if (lo >= hi) continue;
        ASSIGN_OR_RETURN(torch::Tensor value, ckpt->Get(it->second));
        // A sliced weight is read whole, then cut: one MLP weight's transient.
        if (tp_ != nullptr) value = model::SliceForTensorParallel(slot.name, value, *tp_);
        u->master.narrow(0, lo - u->begin, hi - lo)
            .copy_(value.reshape({-1}).narrow(0, lo - slot.offset, hi - lo));
      }
    }
    RefreshWorkingWeights();
  }
  if (options_.fp16) {
    loss_scale_ = options_.static_loss_scale > 0
                      ? options_.static_loss_scale
                      : std::pow(2.0, static_cast<double>(options_.initial_scale_power));
  }
  hysteresis_left_ = options_.hysteresis;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Working weights (stage 3's gather and free: engine_stage3.cc)

void Engine::RefreshWorkingWeights() {
  torch::NoGradGuard no_grad;
  std::vector<Handle> pending;
  for (auto& up : units_) {
    Unit& u = *up;
    if (options_.stage == 0) {
      if (!u.full.is_same(u.master)) u.full.copy_(u.master);
    } else if (options_.stage <= 2 || u.persistent) {
      torch::Tensor source = u.master.detach().to(options_.device, options_.compute_dtype);
      pending.push_back(comm_->AllGather(source, u.full, "weights of " + u.name));
    }
  }
  for (Handle& h : pending) h.Wait();
}

// ---------------------------------------------------------------------------------------------
// Training

absl::Status Engine::Backward(const torch::Tensor& loss) {
  if (frozen_) return absl::FailedPreconditionError("Backward on a frozen (forward-only) engine");
  return model::Guarded("backward", [&] { BackwardOrThrow(loss); });
}

void Engine::BackwardOrThrow(const torch::Tensor& loss) {
  if (options_.stage < 3) {
    // Autograd accumulates into the views of full_grad; it would replace a .grad it cannot add
    // to in place, so check and fold any such back in.
    (options_.fp16 ? loss * loss_scale_ : loss).backward();
    for (auto& u : units_) {
      for (Unit::Slot& slot : u->slots) {
        torch::Tensor& g = slot.param.mutable_grad();
        torch::Tensor view = u->full_grad.narrow(0, slot.offset, slot.numel).view(slot.shape);
        if (!g.defined() || g.data_ptr() != view.data_ptr()) {
          if (g.defined()) view.copy_(g);
          g = view;
        }
      }
    }
    if (options_.stage == 2) ReduceScatterGradients();
    return;
  }
  try {
    (options_.fp16 ? loss * loss_scale_ : loss).backward();
    FinishReduces(0);
  } catch (...) {
    AbandonReduces();
    EndMicroStep();
    throw;
  }
  EndMicroStep();
}

void Engine::ReduceScatterGradients() {
  // Every unit's reduce-scatter in flight at once; each rank adds its slice of the sum to its
  // fp32 gradient slice and clears the full buffer for the next micro-batch.
  std::vector<Handle> pending;
  std::vector<torch::Tensor> parts;
  for (auto& u : units_) {
    parts.push_back(torch::empty({u->shard}, u->full_grad.options()));
    pending.push_back(comm_->ReduceScatter(u->full_grad, parts.back(), "gradients of " + u->name));
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    pending[i].Wait();
    units_[i]->grad32.add_(parts[i].to(units_[i]->grad32.options()));
    units_[i]->full_grad.zero_();
  }
}

torch::Tensor& Engine::ShardGrad(Unit& u) {
  if (options_.stage == 3) return u.master.mutable_grad();
  if (options_.stage == 0) return u.full_grad;
  return u.grad32;
}

absl::StatusOr<StepResult> Engine::Step(double lr) {
  if (frozen_) return absl::FailedPreconditionError("Step on a frozen (forward-only) engine");
  return model::Guarded("optimizer step", [&] { return StepOrThrow(lr); });
}

StepResult Engine::StepOrThrow(double lr) {
  torch::NoGradGuard no_grad;
  StepResult result;
  // 1. Gradients summed across ranks into each rank's slices; with tensor parallelism the
  // replicated weights' gradients also averaged over the group (engine_tensor_parallel.cc).
  SumGradientsAcrossRanks();
  if (tp_ != nullptr) AverageReplicatedGradients();

  // 2. The global norm: every rank's slices (stage 0: the whole, the same on every rank).
  const double sum_squares = GlobalGradSquares();
  const double scale = options_.fp16 ? loss_scale_ : 1.0;
  result.grad_norm = std::sqrt(sum_squares) / scale;
  result.loss_scale = scale;

  // 3. fp16: an overflow skips the step and lowers the scale (DeepSpeed's dynamic scaler).
  if (options_.fp16 && !std::isfinite(result.grad_norm)) {
    result.skipped = true;
    LowerLossScale();
  } else {
    // 4. AdamW over each slice with unscaled, clipped gradients.
    double coefficient = 1.0 / scale;
    if (options_.gradient_clipping > 0) {
      const double clip = options_.gradient_clipping / (result.grad_norm + 1e-6);
      if (clip < 1) coefficient *= clip;
    }
    UpdateMasters(coefficient, lr);
    RaiseLossScaleAfterGoodStep();
    // 5. Working weights from the updated masters.
    RefreshWorkingWeights();
  }

  // 6. Gradients cleared for the next accumulation.
  ClearGradients();
  return result;
}

void Engine::SumGradientsAcrossRanks() {
  if (options_.stage == 0) {
    std::vector<Handle> pending;
    for (auto& u : units_) {
      const int64_t bucket = std::max<int64_t>(1, options_.reduce_bucket_size);
      for (int64_t at = 0; at < u->numel; at += bucket) {
        pending.push_back(
            comm_->AllReduce(u->full_grad.narrow(0, at, std::min(bucket, u->numel - at)),
                             "gradients of " + u->name));
      }
    }
    for (Handle& h : pending) h.Wait();
  } else if (options_.stage == 1) {
    ReduceScatterGradients();
  }
}

double Engine::GlobalGradSquares() {
  if (tp_ != nullptr) return TensorParallelGradSquares();  // engine_tensor_parallel.cc
  // Each slice's norm on its device, squared and summed in fp64 there: one host
  // synchronisation for the whole model (the clip coefficient needs the value), not one per unit.
  std::vector<torch::Tensor> norms;
  for (auto& u : units_) {
    torch::Tensor& g = ShardGrad(*u);
    if (g.defined()) {
      norms.push_back(g.detach().norm(2, torch::kFloat32).to(torch::kFloat64).reshape({1}));
    }
  }
  torch::Tensor squares = norms.empty() ? torch::zeros({1}, torch::kFloat64)
                                        : torch::cat(norms).square().sum().reshape({1});
  if (options_.stage >= 1) {
    squares = squares.to(torch::kCPU).contiguous();
    comm_->AllReduce(squares, "gradient norm").Wait();
  }
  return squares.item<double>();
}

void Engine::LowerLossScale() {
  if (options_.static_loss_scale <= 0) {
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      loss_scale_ = std::max(loss_scale_ / 2, options_.min_loss_scale);
    }
    good_steps_ = 0;
  }
}

void Engine::UpdateMasters(double coefficient, double lr) {
  optimizer_->BeginStep();
  for (auto& up : units_) {
    Unit& u = *up;
    torch::Tensor& raw = ShardGrad(u);
    torch::Tensor p = u.master.detach();
    // A unit that did not run has zero gradients, as in the flat buffers of stages 0-2 (and
    // DeepSpeed's): AdamW still decays it.
    const torch::Tensor grad = raw.defined() ? raw.detach() : torch::zeros_like(p);
    optimizer_->Update(u.optimizer_slice, p, grad, coefficient, lr, u.decay_ranges);
  }
}

void Engine::RaiseLossScaleAfterGoodStep() {
  if (options_.fp16 && options_.static_loss_scale <= 0) {
    ++good_steps_;
    if (good_steps_ % options_.loss_scale_window == 0) {
      loss_scale_ *= 2;
      hysteresis_left_ = options_.hysteresis;
    }
  }
}

void Engine::ClearGradients() {
  for (auto& u : units_) {
    if (options_.stage == 3) {
      u->master.mutable_grad() = torch::Tensor();
    } else {
      u->full_grad.zero_();
      if (u->grad32.defined()) u->grad32.zero_();
    }
  }
}

}  // namespace trainctl::zero
