#include "worker/trainer/model/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"

namespace trainctl::model {
namespace {

// Holds the group for backward: the struct outlives every graph built while it is set.
struct Group : torch::CustomClassHolder {
  const TensorParallel* tp = nullptr;
};

torch::Tensor Summed(const torch::Tensor& x, const TensorParallel& tp) {
  torch::Tensor out = x.contiguous().clone();
  tp.all_reduce(out);
  return out;
}

// f: identity forward, the input gradient summed over the group in backward (each rank's part
// of the MLP sends back its share of the gradient of the whole input).
class CopyFunction : public torch::autograd::Function<CopyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               c10::intrusive_ptr<Group> group) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(group));
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = static_cast<Group*>(ctx->saved_data["group"].toCapsule().get());
    return {Summed(grads[0], *group->tp), torch::Tensor()};
  }
};

// g: the parts summed forward; the gradient of the sum is the same for every part.
class ReduceFunction : public torch::autograd::Function<ReduceFunction> {
 public:
  // In place (the part is a fresh product no other node saved): one [tokens, hidden] copy fewer
  // per MLP call.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               c10::intrusive_ptr<Group> group) {
    if (!x.is_contiguous()) return Summed(x, *group->tp);
    ctx->mark_dirty({x});
    group->tp->all_reduce(x);
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

// The group's logits joined along the last dim; backward: this rank's columns.
class GatherVocabFunction : public torch::autograd::Function<GatherVocabFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               c10::intrusive_ptr<Group> group) {
    const TensorParallel& tp = *group->tp;
    const int64_t part = x.size(-1);
    ctx->saved_data["part"] = part;
    ctx->saved_data["rank"] = tp.rank;
    // [size * part, rows]: each rank's columns as rows, then side by side again.
    const torch::Tensor rows = x.reshape({-1, part}).t().contiguous();
    const torch::Tensor joined = tp.all_gather(rows).t();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = part * tp.size;
    return joined.reshape(shape);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t part = ctx->saved_data["part"].toInt();
    const int64_t rank = ctx->saved_data["rank"].toInt();
    return {grads[0].narrow(-1, rank * part, part).contiguous(), torch::Tensor()};
  }
};

c10::intrusive_ptr<Group> GroupOf(const TensorParallel& tp) {
  auto group = c10::make_intrusive<Group>();
  group->tp = &tp;
  return group;
}

}  // namespace

int TensorParallelDim(const std::string& name, const TensorParallel& tp) {
  if (tp.vocab_parallel && (name == "model.embed_tokens.weight" || name == "lm_head.weight")) {
    return 0;
  }
  if (!absl::StartsWith(name, "model.layers.")) return -1;
  if (absl::EndsWith(name, ".mlp.gate_proj.weight") || absl::EndsWith(name, ".mlp.up_proj.weight"))
    return 0;
  if (absl::EndsWith(name, ".mlp.down_proj.weight")) return 1;
  if (tp.attention && absl::StrContains(name, ".self_attn.")) {
    for (const char* proj : {".q_proj.", ".k_proj.", ".v_proj."}) {
      if (absl::StrContains(name, proj)) return 0;
    }
    if (absl::EndsWith(name, ".o_proj.weight")) return 1;
  }
  return -1;
}

torch::Tensor SliceForTensorParallel(const std::string& name, const torch::Tensor& full,
                                     const TensorParallel& tp) {
  const int dim = TensorParallelDim(name, tp);
  if (dim < 0 || tp.size <= 1) return full;
  TORCH_CHECK(full.size(dim) % tp.size == 0, "tensor parallelism: dim ", dim, " of ", name, " ",
              full.sizes(), " does not divide among ", tp.size, " ranks");
  const int64_t part = full.size(dim) / tp.size;
  return full.narrow(dim, tp.rank * part, part).contiguous().clone();
}

torch::Tensor JoinTensorParallel(const std::string& name, const torch::Tensor& slice,
                                 const TensorParallel& tp) {
  const int dim = TensorParallelDim(name, tp);
  if (dim < 0 || tp.size <= 1) return slice;
  // Rank-major along dim 0: [size * rows, cols]; a row-parallel weight's column blocks are then
  // moved side by side.
  const torch::Tensor stacked = tp.all_gather(slice.contiguous());
  if (dim == 0) return stacked;
  return torch::cat(stacked.chunk(tp.size, 0), dim);
}

std::vector<int64_t> WholeShape(const std::string& name, std::vector<int64_t> shape,
                                const TensorParallel& tp) {
  const int dim = TensorParallelDim(name, tp);
  if (dim >= 0) shape[static_cast<size_t>(dim)] *= tp.size;
  return shape;
}

torch::Tensor CopyToTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (tp.size <= 1) return x;
  return CopyFunction::apply(x, GroupOf(tp));
}

torch::Tensor ReduceFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (tp.size <= 1) return x;
  return ReduceFunction::apply(x, GroupOf(tp));
}

torch::Tensor VocabParallelEmbedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                     const TensorParallel& tp) {
  const int64_t rows = weight.size(0);
  const int64_t first = tp.rank * rows;
  const torch::Tensor mine = ids.ge(first).logical_and(ids.lt(first + rows));
  const torch::Tensor local = (ids - first).masked_fill(mine.logical_not(), 0);
  const torch::Tensor part =
      torch::embedding(weight, local) * mine.unsqueeze(-1).to(weight.scalar_type());
  return ReduceFromTensorParallel(part, tp);
}

torch::Tensor GatherVocabParallel(const torch::Tensor& logits, const TensorParallel& tp) {
  if (tp.size <= 1) return logits;
  return GatherVocabFunction::apply(logits, GroupOf(tp));
}

}  // namespace trainctl::model
