// What the engine holds, seen from outside: its layout, its memory accounting, its shards for
// checkpoints and the full weights for export, and every unit held gathered for generation.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/trainer/model/status_guard.h"
#include "worker/trainer/zero/engine.h"
#include "worker/trainer/zero/internal/engine_unit.h"

namespace trainctl::zero {

nlohmann::json Engine::Layout() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& u : units_) {
    nlohmann::json params = nlohmann::json::array();
    for (const Unit::Slot& slot : u->slots)
      params.push_back({slot.name, WholeShape(slot.name, slot.shape)});
    out.push_back({{"unit", u->name}, {"numel", WholeNumel(*u)}, {"params", params}});
  }
  return out;
}

MemoryStats Engine::Memory() const {
  MemoryStats m;
  auto bytes = [](const torch::Tensor& t) {
    return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : int64_t{0};
  };
  for (const auto& u : units_) {
    m.parameters += WholeNumel(*u);
    m.master_bytes += bytes(u->master);
    const bool aliased = u->full.defined() && u->full.is_same(u->master);
    m.gradient_bytes += bytes(u->full_grad) + bytes(u->grad32);
    // Stage 3: the fp32 gradient slice exists from the first backward to the step.
    if (options_.stage == 3 && !frozen_) m.gradient_bytes += u->shard * int64_t{4};
    // Stage 3 keeps every unit's working buffer; only resident ones hold bytes.
    if (!aliased && (options_.stage < 3 || u->resident)) m.working_bytes += bytes(u->full);
  }
  if (optimizer_) m.optimizer_bytes = optimizer_->bytes();
  const int64_t element = torch::elementSize(options_.compute_dtype);
  m.peak_working_bytes = peak_live_numel_ * element;
  if (options_.stage == 0 && options_.compute_dtype == torch::kFloat32) m.peak_working_bytes = 0;
  return m;
}

Engine::HeldWeights& Engine::HeldWeights::operator=(HeldWeights&& other) noexcept {
  if (this != &other) {
    HeldWeights dropped(std::move(*this));
    engine_ = std::exchange(other.engine_, nullptr);
    bytes_ = other.bytes_;
  }
  return *this;
}

Engine::HeldWeights::~HeldWeights() {
  if (engine_ == nullptr) return;
  for (auto& u : engine_->units_) engine_->ReleaseOne(*u);
}

absl::StatusOr<Engine::HeldWeights> Engine::HoldWeights() {
  HeldWeights held;
  if (options_.stage < 3) return held;
  RETURN_IF_ERROR(model::Guarded(
      "gathering the weights for generation",
      [&] {
        // Every gather in flight at once, then bound.
        for (auto& u : units_) {
          if (!u->persistent) StartGather(*u);
        }
        for (auto& u : units_) {
          AcquireOne(*u);
          held.bytes_ +=
              u->padded * static_cast<int64_t>(torch::elementSize(options_.compute_dtype));
        }
      },
      absl::StatusCode::kResourceExhausted));
  held.engine_ = this;
  return held;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint state

Engine::ShardState Engine::SaveShards() const {
  if (tp_ != nullptr) return SaveWholeShards();  // engine_tensor_parallel.cc
  ShardState s;
  s.ranges = nlohmann::json::object();
  for (const auto& u : units_) {
    // Stage 0 keeps the whole on every rank; rank 0 alone saves it.
    const bool saves = options_.stage >= 1 || rank_ == 0;
    const int64_t n = saves ? u->local() : 0;
    s.ranges[u->name] = {u->begin, u->begin + n};
    if (n == 0) continue;
    s.tensors.emplace_back(u->name + ".master", u->master.detach().narrow(0, 0, n).cpu());
    if (!optimizer_) continue;
    for (const std::string& kind : ShardedAdamW::MomentKinds()) {
      s.tensors.emplace_back(u->name + "." + kind,
                             optimizer_->moment(u->optimizer_slice, kind).narrow(0, 0, n).cpu());
    }
  }
  s.engine = EngineState();
  return s;
}

nlohmann::json Engine::EngineState() const {
  return {{"adam_step", optimizer_ ? optimizer_->step() : 0},
          {"loss_scale", loss_scale_},
          {"good_steps", good_steps_},
          {"hysteresis_left", hysteresis_left_}};
}

absl::Status Engine::LoadShards(const RangeReader& read, const nlohmann::json& engine) {
  torch::NoGradGuard no_grad;
  for (auto& u : units_) {
    const int64_t n = u->local();
    if (n == 0) continue;
    std::vector<std::string> kinds = {"master"};
    if (optimizer_) {
      for (const std::string& kind : ShardedAdamW::MomentKinds()) kinds.push_back(kind);
    }
    for (const std::string& kind : kinds) {
      torch::Tensor values;
      if (tp_ != nullptr) {
        // The whole unit, as saved; this rank's slices of its sliced weights, then its part.
        ASSIGN_OR_RETURN(torch::Tensor whole, read(u->name, kind, 0, WholeNumel(*u)));
        values = SlicedFlat(*u, whole).narrow(0, u->begin, n);
      } else {
        ASSIGN_OR_RETURN(values, read(u->name, kind, u->begin, u->begin + n));
      }
      torch::Tensor& target =
          kind == "master" ? u->master : optimizer_->moment(u->optimizer_slice, kind);
      target.detach().narrow(0, 0, n).copy_(values);
    }
  }
  if (optimizer_) optimizer_->set_step(engine.value("adam_step", int64_t{0}));
  loss_scale_ = engine.value("loss_scale", loss_scale_);
  good_steps_ = engine.value("good_steps", int64_t{0});
  hysteresis_left_ = engine.value("hysteresis_left", options_.hysteresis);
  RefreshWorkingWeights();
  return absl::OkStatus();
}

std::vector<std::pair<std::string, torch::Tensor>> Engine::GatherFullWeights(
    torch::ScalarType dtype, bool keep) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& u : units_) {
    // One unit at a time, converted before it travels: the transient is one unit in `dtype`.
    torch::Tensor full = u->master.detach().to(torch::kCPU, dtype);
    if (options_.stage >= 1) {
      torch::Tensor gathered = torch::empty({u->padded}, full.options());
      comm_->AllGather(full, gathered, "export of " + u->name).Wait();
      full = gathered;
    }
    full = WholeFlat(*u, full);  // tensor parallelism: the group's slices joined
    if (!keep) continue;
    int64_t at = 0;
    for (const Unit::Slot& slot : u->slots) {
      const std::vector<int64_t> shape = WholeShape(slot.name, slot.shape);
      const int64_t numel = c10::multiply_integers(shape);
      out.emplace_back(slot.name, full.narrow(0, at, numel).view(shape).clone());
      at += numel;
    }
  }
  return out;
}

}  // namespace trainctl::zero
