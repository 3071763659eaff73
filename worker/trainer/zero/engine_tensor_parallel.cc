// The engine under tensor parallelism (model/tensor_parallel.h): the gradient norm over sliced
// and replicated weights, and the conversions between a unit's flat buffer in this rank's layout
// (its MLP and attention weights sliced) and the whole weights' layout that checkpoints, Layout()
// and export keep, so that they do not depend on the group's size.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallelism_spec.h"
#include "worker/trainer/zero/engine.h"
#include "worker/trainer/zero/internal/engine_unit.h"

namespace trainctl::zero {

absl::Status Engine::CheckTensorParallelFits(const model::Qwen2VLConfig& config) const {
  const int64_t size = tp_->size;
  std::string what;
  if (config.intermediate_size % size != 0) {
    what = absl::StrCat(config.intermediate_size, "-wide MLP (intermediate_size)");
  } else if (tp_->attention && config.num_attention_heads % size != 0) {
    what = absl::StrCat(config.num_attention_heads, " attention heads (num_attention_heads)",
                        kTensorParallelMlpOnlyHint);
  } else if (tp_->attention && config.num_key_value_heads % size != 0) {
    what = absl::StrCat(config.num_key_value_heads, " key/value heads (num_key_value_heads)",
                        kTensorParallelMlpOnlyHint);
  } else if (tp_->vocab_parallel && config.vocab_size % size != 0) {
    what = absl::StrCat(config.vocab_size, "-token vocabulary");
  } else {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("parallelism.tensor_parallel_size ", size,
                                                 " does not divide ", config.source, "'s ", what));
}

double Engine::TensorParallelGradSquares() {
  // [replicated, sliced], each summed in fp64 over its ranges on the gradients' device, read
  // once. The replicated weights' gradients are equal on every rank of the tensor-parallel
  // group (AverageReplicatedGradients), and the ZeRO groups of its ranks have the same layout, so
  // their sums are too and every rank clips alike; the sliced weights' squares are summed over
  // the group.
  std::vector<torch::Tensor> parts[2];
  for (auto& u : units_) {
    torch::Tensor& g = ShardGrad(*u);
    if (!g.defined()) continue;
    int i = 0;
    for (const auto* ranges : {&u->replicated_ranges, &u->sliced_ranges}) {
      for (const auto& [lo, hi] : *ranges) {
        parts[i].push_back(g.detach().narrow(0, lo, hi - lo).to(torch::kFloat64).square().sum());
      }
      ++i;
    }
  }
  torch::Tensor squares = torch::zeros({2}, torch::kFloat64);
  for (int i = 0; i < 2; ++i) {
    if (!parts[i].empty()) squares[i] = torch::stack(parts[i]).sum().cpu();
  }
  if (options_.stage >= 1) comm_->AllReduce(squares, "gradient norm").Wait();
  torch::Tensor sliced = squares.narrow(0, 1, 1).clone();
  tp_->all_reduce(sliced);
  return squares[0].item<double>() + sliced.item<double>();
}

void Engine::AverageReplicatedGradients() {
  // One sum per unit over the group (the ranks' ranges match: same layouts, same ZeRO position).
  for (auto& u : units_) {
    torch::Tensor& g = ShardGrad(*u);
    if (!g.defined() || u->replicated_ranges.empty()) continue;
    std::vector<torch::Tensor> pieces;
    for (const auto& [lo, hi] : u->replicated_ranges) pieces.push_back(g.narrow(0, lo, hi - lo));
    torch::Tensor flat = torch::cat(pieces);
    tp_->all_reduce(flat);
    flat.div_(static_cast<double>(tp_->size));
    int64_t at = 0;
    for (const auto& [lo, hi] : u->replicated_ranges) {
      g.narrow(0, lo, hi - lo).copy_(flat.narrow(0, at, hi - lo));
      at += hi - lo;
    }
  }
}

int64_t Engine::WholeNumel(const Unit& u) const {
  if (tp_ == nullptr) return u.numel;
  int64_t n = 0;
  for (const Unit::Slot& slot : u.slots) {
    n += model::TensorParallelDim(slot.name, *tp_) >= 0 ? slot.numel * tp_->size : slot.numel;
  }
  return n;
}

std::vector<int64_t> Engine::WholeShape(const std::string& name,
                                        const std::vector<int64_t>& shape) const {
  return tp_ == nullptr ? shape : model::WholeShape(name, shape, *tp_);
}

torch::Tensor Engine::WholeFlat(const Unit& u, const torch::Tensor& flat) const {
  if (tp_ == nullptr) return flat.narrow(0, 0, u.numel);
  std::vector<torch::Tensor> parts;
  for (const Unit::Slot& slot : u.slots) {
    const torch::Tensor piece = flat.narrow(0, slot.offset, slot.numel).view(slot.shape);
    parts.push_back(model::JoinTensorParallel(slot.name, piece, *tp_).reshape({-1}));
  }
  return torch::cat(parts);
}

torch::Tensor Engine::SlicedFlat(const Unit& u, const torch::Tensor& whole) const {
  if (tp_ == nullptr) return whole.narrow(0, 0, u.numel);
  std::vector<torch::Tensor> parts;
  int64_t at = 0;
  for (const Unit::Slot& slot : u.slots) {
    const std::vector<int64_t> shape = WholeShape(slot.name, slot.shape);
    const int64_t numel = c10::multiply_integers(shape);
    const torch::Tensor piece = whole.narrow(0, at, numel).view(shape);
    parts.push_back(model::SliceForTensorParallel(slot.name, piece, *tp_).reshape({-1}));
    at += numel;
  }
  return torch::cat(parts);
}

Engine::ShardState Engine::SaveWholeShards() const {
  ShardState s;
  s.ranges = nlohmann::json::object();
  const int64_t world = world_comm_->world_size(), rank = world_comm_->rank();
  std::vector<std::string> kinds = {"master"};
  if (optimizer_) {
    for (const std::string& kind : ShardedAdamW::MomentKinds()) kinds.push_back(kind);
  }
  for (const auto& u : units_) {
    // As SaveShards splits a unit over the ranks (stage 0: rank 0 saves it whole).
    const int64_t whole_numel = WholeNumel(*u);
    const int64_t per = (whole_numel + world - 1) / world;
    const int64_t begin = options_.stage >= 1 ? std::min(whole_numel, rank * per) : 0;
    const int64_t n =
        options_.stage >= 1 ? std::min(per, whole_numel - begin) : (rank == 0 ? whole_numel : 0);
    s.ranges[u->name] = {begin, begin + n};
    for (const std::string& kind : kinds) {
      const torch::Tensor slice =
          kind == "master" ? u->master.detach() : optimizer_->moment(u->optimizer_slice, kind);
      torch::Tensor local = slice;
      if (options_.stage >= 1) {  // this rank's layout, whole over the ZeRO group
        local = torch::empty({u->padded}, slice.options());
        comm_->AllGather(slice, local, "checkpoint of " + u->name).Wait();
      }
      const torch::Tensor whole = WholeFlat(*u, local);
      if (n > 0)
        s.tensors.emplace_back(u->name + "." + kind, whole.narrow(0, begin, n).cpu().clone());
    }
  }
  s.engine = EngineState();
  return s;
}

}  // namespace trainctl::zero
