#include "worker/trainer/model/internal/linear_cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <utility>

namespace trainctl::model::internal {
namespace {

struct Chunk {
  torch::Tensor loss;         // float32 scalar: this chunk's summed loss
  torch::Tensor grad_logits;  // [n, V] in the logits' dtype, when wanted
};

// One chunk: its loss and, when `want_grad`, d(loss)/d(logits) = softmax - onehot on valid rows.
Chunk RunChunk(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& labels,
               int64_t ignore_index, bool want_grad) {
  const torch::Tensor logits = torch::linear(x, weight);
  torch::Tensor lf = logits.to(torch::kFloat32);
  const torch::Tensor lse = lf.logsumexp(-1);
  const torch::Tensor valid = labels.ne(ignore_index);
  const torch::Tensor safe = labels.masked_fill(valid.logical_not(), 0).unsqueeze(1);
  const torch::Tensor picked = lf.gather(1, safe).squeeze(1);
  Chunk out;
  out.loss = ((lse - picked) * valid.to(torch::kFloat32)).sum();
  if (want_grad) {
    lf.sub_(lse.unsqueeze(1)).exp_();  // softmax, in place
    lf.scatter_add_(1, safe, valid.to(torch::kFloat32).neg().unsqueeze(1));
    lf.mul_(valid.to(torch::kFloat32).unsqueeze(1));
    out.grad_logits = lf.to(logits.scalar_type());
  }
  return out;
}

// One chunk of the vocab-parallel loss: as RunChunk over this rank's columns, the row's
// log-sum-exp and target logit combined over the group.
Chunk RunVocabChunk(const torch::Tensor& x, const torch::Tensor& weight,
                    const torch::Tensor& labels, int64_t ignore_index, const TensorParallel& tp,
                    bool want_grad) {
  const torch::Tensor logits = torch::linear(x, weight);
  torch::Tensor lf = logits.to(torch::kFloat32);
  const int64_t first = tp.rank * weight.size(0);
  // log sum over the group of exp(lse_r): each rank's [1, n] gathered to [size, n].
  const torch::Tensor lse = tp.all_gather(lf.logsumexp(-1).unsqueeze(0).contiguous()).logsumexp(0);
  const torch::Tensor valid = labels.ne(ignore_index);
  const torch::Tensor mine =
      valid.logical_and(labels.ge(first)).logical_and(labels.lt(first + weight.size(0)));
  const torch::Tensor safe = (labels - first).masked_fill(mine.logical_not(), 0).unsqueeze(1);
  torch::Tensor picked = (lf.gather(1, safe).squeeze(1) * mine.to(torch::kFloat32)).contiguous();
  tp.all_reduce(picked);
  Chunk out;
  out.loss = ((lse - picked) * valid.to(torch::kFloat32)).sum();
  if (want_grad) {
    lf.sub_(lse.unsqueeze(1)).exp_();  // this rank's columns of the softmax, in place
    lf.scatter_add_(1, safe, mine.to(torch::kFloat32).neg().unsqueeze(1));
    lf.mul_(valid.to(torch::kFloat32).unsqueeze(1));
    out.grad_logits = lf.to(logits.scalar_type());
  }
  return out;
}

// The group, held for the autograd function's forward.
struct VocabGroup : torch::CustomClassHolder {
  const TensorParallel* tp = nullptr;
};

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  // `group` null: the whole head; else its rows over the tensor-parallel group.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& labels, int64_t ignore_index,
                                                int64_t chunk_rows,
                                                c10::intrusive_ptr<VocabGroup> group) {
    const TensorParallel* tp = group ? group->tp : nullptr;
    const int64_t n = x.size(0);
    torch::Tensor loss = torch::zeros({}, x.options().dtype(torch::kFloat32));
    torch::Tensor grad_x = x.requires_grad() ? torch::empty_like(x) : torch::Tensor();
    torch::Tensor grad_w =
        weight.requires_grad()
            ? torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32))
            : torch::Tensor();
    for (int64_t start = 0; start < n; start += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - start);
      const torch::Tensor xc = x.narrow(0, start, rows);
      const torch::Tensor lc = labels.narrow(0, start, rows);
      const Chunk c = tp != nullptr ? RunVocabChunk(xc, weight, lc, ignore_index, *tp, true)
                                    : RunChunk(xc, weight, lc, ignore_index, true);
      loss.add_(c.loss);
      // The matmuls as linear's backward does them (autocast: in its dtype); with the head split,
      // the input's gradient is the sum of every rank's columns' part.
      if (grad_x.defined()) {
        torch::Tensor part = torch::matmul(c.grad_logits, weight).contiguous();
        if (tp != nullptr) tp->all_reduce(part);
        grad_x.narrow(0, start, rows).copy_(part);
      }
      if (grad_w.defined()) grad_w.add_(torch::matmul(c.grad_logits.t(), xc));
    }
    ctx->save_for_backward({grad_x, grad_w});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return {loss};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& scale = grad_outputs[0];
    const auto weight_dtype =
        static_cast<torch::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    torch::Tensor gx, gw;
    if (saved[0].defined()) gx = saved[0] * scale.to(saved[0].scalar_type());
    if (saved[1].defined()) gw = (saved[1] * scale).to(weight_dtype);
    return {gx, gw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t DefaultChunkRows(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t{1} << 27) / std::max<int64_t>(1, vocab));
}

namespace {

torch::Tensor CrossEntropySum(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& labels, const TensorParallel* tp,
                              int64_t ignore_index, int64_t chunk_rows) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "LinearCrossEntropySum: x must be [N, H] and weight [V, H], got ", x.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == x.size(0),
              "LinearCrossEntropySum: labels must be [N] for x ", x.sizes(), ", got ",
              labels.sizes());
  const torch::Tensor l = labels.to(x.device(), torch::kInt64);
  // Chunks sized by the whole vocabulary: every rank of a group cuts the rows alike.
  const int64_t vocab = weight.size(0) * (tp != nullptr ? tp->size : 1);
  const int64_t rows = chunk_rows > 0 ? chunk_rows : DefaultChunkRows(vocab);
  const bool grad = torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (!grad) {
    torch::Tensor loss = torch::zeros({}, x.options().dtype(torch::kFloat32));
    for (int64_t start = 0; start < x.size(0); start += rows) {
      const int64_t n = std::min(rows, x.size(0) - start);
      const torch::Tensor xc = x.narrow(0, start, n), lc = l.narrow(0, start, n);
      loss.add_(tp != nullptr ? RunVocabChunk(xc, weight, lc, ignore_index, *tp, false).loss
                              : RunChunk(xc, weight, lc, ignore_index, false).loss);
    }
    return loss;
  }
  c10::intrusive_ptr<VocabGroup> group;
  if (tp != nullptr) {
    group = c10::make_intrusive<VocabGroup>();
    group->tp = tp;
  }
  return LinearCrossEntropy::apply(x, weight, l, ignore_index, rows, std::move(group))[0];
}

}  // namespace

torch::Tensor LinearCrossEntropySum(const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& labels, int64_t ignore_index,
                                    int64_t chunk_rows) {
  return CrossEntropySum(x, weight, labels, nullptr, ignore_index, chunk_rows);
}

torch::Tensor VocabParallelCrossEntropySum(const torch::Tensor& x, const torch::Tensor& weight,
                                           const torch::Tensor& labels, const TensorParallel& tp,
                                           int64_t ignore_index, int64_t chunk_rows) {
  return CrossEntropySum(x, weight, labels, tp.size > 1 ? &tp : nullptr, ignore_index, chunk_rows);
}

}  // namespace trainctl::model::internal
