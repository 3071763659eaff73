#include "worker/trainer/model/internal/linear_cross_entropy.h"

#include <algorithm>

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

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, const torch::Tensor& weight,
                                                const torch::Tensor& labels, int64_t ignore_index,
                                                int64_t chunk_rows) {
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
      const Chunk c = RunChunk(xc, weight, labels.narrow(0, start, rows), ignore_index, true);
      loss.add_(c.loss);
      // The matmuls as linear's backward does them (autocast: in its dtype).
      if (grad_x.defined())
        grad_x.narrow(0, start, rows).copy_(torch::matmul(c.grad_logits, weight));
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
    return {gx, gw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t DefaultChunkRows(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t{1} << 27) / std::max<int64_t>(1, vocab));
}

torch::Tensor LinearCrossEntropySum(const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& labels, int64_t ignore_index,
                                    int64_t chunk_rows) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "LinearCrossEntropySum: x must be [N, H] and weight [V, H], got ", x.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == x.size(0),
              "LinearCrossEntropySum: labels must be [N] for x ", x.sizes(), ", got ",
              labels.sizes());
  const torch::Tensor l = labels.to(x.device(), torch::kInt64);
  const int64_t rows = chunk_rows > 0 ? chunk_rows : DefaultChunkRows(weight.size(0));
  const bool grad = torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (!grad) {
    torch::Tensor loss = torch::zeros({}, x.options().dtype(torch::kFloat32));
    for (int64_t start = 0; start < x.size(0); start += rows) {
      const int64_t n = std::min(rows, x.size(0) - start);
      loss.add_(
          RunChunk(x.narrow(0, start, n), weight, l.narrow(0, start, n), ignore_index, false).loss);
    }
    return loss;
  }
  return LinearCrossEntropy::apply(x, weight, l, ignore_index, rows)[0];
}

}  // namespace trainctl::model::internal
