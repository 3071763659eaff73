#include "worker/trainer/model/internal/activation_checkpoint.h"

#include <utility>

#include "worker/trainer/model/autocast_state.h"

namespace trainctl::model::internal {
namespace {

// What backward needs besides the saved input; carried in the context as a capsule.
struct Recompute : torch::CustomClassHolder {
  UnitFn fn;
  std::vector<torch::Tensor> params;
  AutocastState autocast;
  bool input_requires_grad = false;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<Recompute> recompute,
                                                const torch::Tensor& input,
                                                at::TensorList /*params: inputs for autograd*/) {
    recompute->input_requires_grad = input.requires_grad();
    ctx->save_for_backward({input});
    torch::NoGradGuard no_grad;
    torch::Tensor output = recompute->fn(input);
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(recompute));
    return {output};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto* recompute =
        static_cast<const Recompute*>(ctx->saved_data["recompute"].toCapsule().get());
    torch::Tensor input = ctx->get_saved_variables()[0].detach();
    input.set_requires_grad(recompute->input_requires_grad);

    torch::autograd::variable_list wrt;
    if (recompute->input_requires_grad) wrt.push_back(input);
    for (const torch::Tensor& p : recompute->params) {
      if (p.requires_grad()) wrt.push_back(p);
    }
    torch::autograd::variable_list grads;
    {
      torch::AutoGradMode grad_on(true);
      AutocastScope autocast(recompute->autocast);
      const torch::Tensor output = recompute->fn(input);
      if (!wrt.empty() && output.requires_grad()) {
        grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      }
    }
    // One entry per forward argument: the capsule, the input, then each parameter.
    torch::autograd::variable_list result;
    result.reserve(2 + recompute->params.size());
    result.emplace_back();
    size_t next = 0;
    auto take = [&](bool wanted) {
      if (!wanted) return torch::Tensor();
      return next < grads.size() ? grads[next++] : torch::Tensor();
    };
    result.push_back(take(recompute->input_requires_grad));
    for (const torch::Tensor& p : recompute->params) result.push_back(take(p.requires_grad()));
    return result;
  }
};

}  // namespace

torch::Tensor CheckpointedCall(const UnitFn& fn, const torch::Tensor& input,
                               const std::vector<torch::Tensor>& params) {
  bool any_grad = input.requires_grad();
  for (const torch::Tensor& p : params) any_grad = any_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !any_grad) return fn(input);

  auto recompute = c10::make_intrusive<Recompute>();
  recompute->fn = fn;
  recompute->params = params;
  recompute->autocast = AutocastState::Current();
  return CheckpointFunction::apply(std::move(recompute), input, at::TensorList(params))[0];
}

}  // namespace trainctl::model::internal
