// Stage 3: each unit as one autograd node, and the working weights it gathers and frees.
//
// Forward gathers the unit's weights (and those it borrows: the tied head reads the embedding),
// runs the unit with autograd recording as a plain module would, and frees the weights' bytes.
// The working buffer itself, one flat tensor per unit with the parameters bound to views of it,
// lives as long as the engine: the references autograd saved to the weights (a linear keeps its
// weight for its input's gradient) stay valid while holding no memory, as PyTorch FSDP frees a
// flat parameter's storage. Backward gathers the bytes back into the same buffer, backpropagates
// through the graph recorded in forward (DeepSpeed's LinearFunctionForZeroStage3 keeps the input
// and re-gathers the weight the same way) and reduce-scatters the weight gradients into the
// owners' fp32 slices. No unit runs twice, unless gradient checkpointing asks for it: then the
// unit runs without recording and is recomputed once, in backward.
//
// Writes into a working buffer never bump the parameters' version counters: set_data gives a
// parameter its own counter, so autograd's saved weights stay valid across free and re-gather.
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <utility>

#include "worker/trainer/model/autocast_state.h"
#include "worker/trainer/zero/engine.h"
#include "worker/trainer/zero/internal/engine_unit.h"

namespace trainctl::zero {
namespace {

// The bytes of a working buffer go; the tensor, its views and the parameters bound to them stay.
void FreeBytes(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

// The bytes back (contents undefined until a gather fills them).
void AllocateBytes(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->data_ptr().get() != nullptr && storage->nbytes() >= bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

// What a unit's backward needs, carried in the autograd context as a capsule.
struct UnitCall : torch::CustomClassHolder {
  Engine* engine = nullptr;
  model::UnitRunner::UnitFn fn;
  model::AutocastState autocast;
  bool recompute = false;  // checkpointed: no graph kept; fn runs again in backward
  bool input_requires_grad = false;
  size_t trace_position = 0;
  torch::Tensor input, output;  // not recomputed: the graph recorded in forward, input to output
};

class Engine::Runner::Function : public torch::autograd::Function<Function> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<UnitCall> call,
                                                const torch::Tensor& input,
                                                at::TensorList /*anchors: the slices*/) {
    Engine& e = *call->engine;
    Unit& u = *e.trace_[call->trace_position];
    e.Acquire(u);
    if (e.options_.overlap_comm) e.Prefetch(e.last_trace_, call->trace_position + 1);
    torch::Tensor output;
    if (call->recompute) {
      output = call->fn(input);  // autograd's Function runs forward with grad mode off
      ctx->save_for_backward({input});
    } else {
      torch::AutoGradMode grad_on(true);
      call->input = input.detach();
      call->input.set_requires_grad(call->input_requires_grad);
      call->output = call->fn(call->input);
      output = call->output.detach();
    }
    ++e.unit_forward_runs_;
    e.Release(u);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return {output};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* call = static_cast<UnitCall*>(ctx->saved_data["call"].toCapsule().get());
    Engine& e = *call->engine;
    Unit& u = *e.trace_[call->trace_position];
    e.Acquire(u);
    if (e.options_.overlap_comm && call->trace_position > 0) {
      // Backward runs the trace in reverse: the unit before this one is next.
      std::vector<Unit*> reverse(
          e.trace_.rbegin() + static_cast<std::ptrdiff_t>(e.trace_.size() - call->trace_position),
          e.trace_.rend());
      e.Prefetch(reverse, 0);
    }

    torch::Tensor input = call->input;
    torch::Tensor output = call->output;
    if (call->recompute) {
      input = ctx->get_saved_variables()[0].detach();
      input.set_requires_grad(call->input_requires_grad);
    }
    std::vector<torch::Tensor> wrt;
    if (call->input_requires_grad) wrt.push_back(input);
    for (const Unit::Slot& slot : u.slots) wrt.push_back(slot.param);
    std::vector<const Unit::Slot*> borrowed_slots;
    for (size_t i = 0; i < u.borrowed.size(); ++i) {
      for (const Unit::Slot& slot : u.borrowed[i]->slots) {
        if (slot.name == u.borrowed_params[i]) {
          borrowed_slots.push_back(&slot);
          wrt.push_back(slot.param);
        }
      }
    }
    torch::autograd::variable_list grads;
    {
      torch::AutoGradMode grad_on(true);
      if (call->recompute) {
        model::AutocastScope autocast(call->autocast);
        output = call->fn(input);
        ++e.unit_forward_runs_;
      }
      grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    call->input = torch::Tensor();
    call->output = torch::Tensor();

    size_t next = 0;
    torch::autograd::variable_list result;
    result.emplace_back();  // the call capsule
    result.push_back(call->input_requires_grad ? grads[next++] : torch::Tensor());
    // The slices' gradients are accumulated by the engine once their reduce-scatters are done,
    // not returned to autograd, so the collectives can run behind the next unit's backward.
    result.resize(result.size() + 1 + u.borrowed.size());

    // This unit's gradients, flattened in its layout and reduce-scattered into the slices. Only
    // what no gradient covers is zeroed (the padding, slots without a gradient, a borrowed unit's
    // other slots): one pass over the buffer, not a zero fill and then the copies.
    auto reduce = [&](Unit& owner,
                      const std::vector<std::pair<const Unit::Slot*, torch::Tensor>>& parts) {
      torch::Tensor flat = torch::empty(
          {owner.padded},
          torch::TensorOptions().dtype(e.options_.compute_dtype).device(e.options_.device));
      int64_t written = 0;  // parts come in layout order
      for (const auto& [slot, g] : parts) {
        if (!g.defined()) continue;
        TORCH_CHECK(slot->offset >= written, "unit ", owner.name, ": slot ", slot->name,
                    " out of layout order");
        if (slot->offset > written) flat.narrow(0, written, slot->offset - written).zero_();
        flat.narrow(0, slot->offset, slot->numel).copy_(g.reshape({-1}));
        written = slot->offset + slot->numel;
      }
      if (owner.padded > written) flat.narrow(0, written, owner.padded - written).zero_();
      e.StartReduce(owner, std::move(flat));
    };
    std::vector<std::pair<const Unit::Slot*, torch::Tensor>> own;
    for (const Unit::Slot& slot : u.slots) own.emplace_back(&slot, grads[next++]);
    reduce(u, own);
    for (size_t i = 0; i < u.borrowed.size(); ++i) {
      reduce(*u.borrowed[i], {{borrowed_slots[i], grads[next++]}});
    }
    e.Release(u);
    e.FinishReduces(/*keep=*/1 + u.borrowed.size());
    return result;
  }
};

torch::Tensor Engine::Runner::RunUnit(const model::ModelUnit& unit, const UnitFn& fn,
                                      const torch::Tensor& input, bool checkpoint) {
  Engine& e = *engine_;
  Unit& u = *e.by_name_.at(unit.name);
  if (!torch::GradMode::is_enabled() || e.frozen_) {
    torch::NoGradGuard no_grad;
    e.Acquire(u);
    torch::Tensor out = fn(input);
    e.Release(u);
    return out;
  }
  auto call = c10::make_intrusive<UnitCall>();
  call->engine = engine_;
  call->fn = fn;
  call->autocast = model::AutocastState::Current();
  call->recompute = checkpoint;
  call->input_requires_grad = input.requires_grad();
  call->trace_position = e.trace_.size();
  e.trace_.push_back(&u);
  std::vector<torch::Tensor> anchors = {u.master};
  for (Unit* b : u.borrowed) anchors.push_back(b->master);
  return Function::apply(std::move(call), input, at::TensorList(anchors))[0];
}

// ---------------------------------------------------------------------------------------------
// Working weights

void Engine::SetFull(Unit& u, const torch::Tensor& full) {
  u.full = full;
  u.resident = true;
  Bind(u);
}

void Engine::Bind(Unit& u) {
  for (Unit::Slot& slot : u.slots) {
    slot.param.set_data(u.full.narrow(0, slot.offset, slot.numel).view(slot.shape));
  }
}

void Engine::FreeWorking(Unit& u) {
  FreeBytes(u.full);
  u.resident = false;
}

void Engine::StartGather(Unit& u) {
  if (u.persistent || u.resident) return;
  torch::Tensor source = u.master.detach();
  if (source.scalar_type() != options_.compute_dtype || source.device() != options_.device) {
    source = source.to(options_.device, options_.compute_dtype);
  }
  AllocateBytes(u.full);
  u.resident = true;
  u.gather = comm_->AllGather(source, u.full, "weights of " + u.name);
  u.gathering = true;
  live_numel_ += u.padded;
  peak_live_numel_ = std::max(peak_live_numel_, live_numel_);
}

void Engine::Acquire(Unit& u) {
  AcquireOne(u);
  for (Unit* b : u.borrowed) AcquireOne(*b);
}

void Engine::Release(Unit& u) {
  ReleaseOne(u);
  for (Unit* b : u.borrowed) ReleaseOne(*b);
}

void Engine::AcquireOne(Unit& u) {
  ++u.refs;
  if (u.persistent) return;
  StartGather(u);
  if (u.gathering) {
    u.gather.Wait();
    u.gathering = false;
  }
}

void Engine::ReleaseOne(Unit& u) {
  if (--u.refs > 0 || u.persistent) return;
  FreeWorking(u);
  live_numel_ -= u.padded;
}

void Engine::Prefetch(const std::vector<Unit*>& order, size_t next) {
  // Gathers ahead along `order` from `next`: at least the next unit, more while they fit in the
  // prefetch bucket, never beyond the live-parameter budget.
  int64_t budget = options_.prefetch_bucket_size;
  for (size_t i = next; i < order.size(); ++i) {
    Unit& u = *order[i];
    if (u.persistent || u.resident) continue;
    if (i > next && u.padded > budget) break;
    if (live_numel_ + u.padded > options_.max_live_parameters && i > next) break;
    StartGather(u);
    budget -= u.padded;
    if (budget <= 0) break;
  }
}

void Engine::EndMicroStep() {
  // Gathers prefetched for a unit that did not run again are dropped.
  for (auto& u : units_) {
    if (u->persistent) continue;
    if (u->gathering) {
      u->gather.Wait();
      u->gathering = false;
    }
    if (u->resident && u->refs == 0) {
      FreeWorking(*u);
      live_numel_ -= u->padded;
    }
  }
  last_trace_ = std::move(trace_);
  trace_.clear();
}

// ---------------------------------------------------------------------------------------------
// Gradients

void Engine::StartReduce(Unit& owner, torch::Tensor flat) {
  PendingReduce r;
  r.owner = &owner;
  // One rank: the reduce-scatter is the identity, and the flat buffer is the slice's gradient.
  r.part = world_ == 1 ? flat : torch::empty({owner.shard}, flat.options());
  r.handle = comm_->ReduceScatter(flat, r.part, "gradients of " + owner.name);
  r.flat = std::move(flat);
  reducing_.push_back(std::move(r));
}

void Engine::FinishReduces(size_t keep) {
  while (reducing_.size() > keep) {
    PendingReduce r = std::move(reducing_.front());
    reducing_.pop_front();
    r.handle.Wait();
    torch::Tensor& grad = r.owner->master.mutable_grad();
    torch::Tensor part = r.part.to(r.owner->master.options().dtype(torch::kFloat32));
    if (grad.defined()) {
      grad.add_(part);
    } else {
      grad = part;  // r.part or its fp32 copy: either is this gradient's own
    }
  }
}

void Engine::AbandonReduces() {
  for (PendingReduce& r : reducing_) {
    try {
      r.handle.Wait();
    } catch (...) {  // the step failed already; its first error is the one reported
    }
  }
  reducing_.clear();
}

}  // namespace trainctl::zero
