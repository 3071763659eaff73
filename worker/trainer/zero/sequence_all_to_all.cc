#include "worker/trainer/zero/sequence_all_to_all.h"

#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainctl::zero {
namespace {

// The exchange itself, with no autograd.
torch::Tensor ExchangeSequenceChunks(Comm& comm, const torch::Tensor& x, int64_t scatter_dim,
                                     int64_t gather_dim) {
  const int64_t w = comm.world_size();
  TORCH_CHECK(x.size(scatter_dim) % w == 0, "SequenceAllToAll: dim ", scatter_dim, " of ",
              x.sizes(), " has size ", x.size(scatter_dim), ", not a multiple of the group's ", w,
              " ranks");
  // [..., S, ...] -> [W, ..., S/W, ...]: row j is chunk j, for rank j.
  std::vector<int64_t> split = x.sizes().vec();
  split[static_cast<size_t>(scatter_dim)] /= w;
  split.insert(split.begin() + scatter_dim, w);
  const torch::Tensor send = x.reshape(split).movedim(scatter_dim, 0).contiguous();
  const torch::Tensor recv = torch::empty_like(send);
  comm.AllToAll(send, recv,
                absl::StrCat("sequence chunks (scatter dim ", scatter_dim, ", gather dim ",
                             gather_dim, ")"))
      .Wait();
  // recv row i came from rank i: [W, ..., g, ...] -> [..., W * g, ...], rank order outermost.
  std::vector<int64_t> joined = recv.sizes().slice(1).vec();
  joined[static_cast<size_t>(gather_dim)] *= w;
  return recv.movedim(0, gather_dim).reshape(joined);
}

// What backward needs: the group and the dims, swapped there.
struct SequenceExchange : torch::CustomClassHolder {
  Comm* comm = nullptr;
  int64_t scatter_dim = 0;
  int64_t gather_dim = 0;
};

class SequenceAllToAllFunction : public torch::autograd::Function<SequenceAllToAllFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               c10::intrusive_ptr<SequenceExchange> exchange) {
    torch::Tensor out =
        ExchangeSequenceChunks(*exchange->comm, x, exchange->scatter_dim, exchange->gather_dim);
    ctx->saved_data["exchange"] = c10::IValue::make_capsule(std::move(exchange));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* exchange = static_cast<SequenceExchange*>(ctx->saved_data["exchange"].toCapsule().get());
    return {ExchangeSequenceChunks(*exchange->comm, grad_outputs[0], exchange->gather_dim,
                                   exchange->scatter_dim),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor SequenceAllToAll(Comm& comm, const torch::Tensor& x, int64_t scatter_dim,
                               int64_t gather_dim) {
  auto exchange = c10::make_intrusive<SequenceExchange>();
  exchange->comm = &comm;
  exchange->scatter_dim = c10::maybe_wrap_dim(scatter_dim, x.dim());
  exchange->gather_dim = c10::maybe_wrap_dim(gather_dim, x.dim());
  return SequenceAllToAllFunction::apply(x, std::move(exchange));
}

}  // namespace trainctl::zero
