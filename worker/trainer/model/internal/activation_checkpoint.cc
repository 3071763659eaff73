#include "worker/trainer/model/internal/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <utility>

namespace trainctl::model::internal {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define TRAINCTL_AUTOCAST_BY_DEVICE 1
#endif

// The thread-local autocast settings of the forward, restored around the recomputation (backward
// may run on another thread, or after the caller left its autocast scope).
struct AutocastState {
  bool cpu_enabled = false;
  bool gpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType gpu_dtype = at::kHalf;

  static AutocastState Current() {
    AutocastState s;
#ifdef TRAINCTL_AUTOCAST_BY_DEVICE
    s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
    s.gpu_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.gpu_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
    s.cpu_enabled = at::autocast::is_cpu_enabled();
    s.gpu_enabled = at::autocast::is_enabled();
    s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
    s.gpu_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
    return s;
  }

  void Apply() const {
#ifdef TRAINCTL_AUTOCAST_BY_DEVICE
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_enabled(at::kCUDA, gpu_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, gpu_dtype);
#else
    at::autocast::set_cpu_enabled(cpu_enabled);
    at::autocast::set_enabled(gpu_enabled);
    at::autocast::set_autocast_cpu_dtype(cpu_dtype);
    at::autocast::set_autocast_gpu_dtype(gpu_dtype);
#endif
  }
};

class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state) : saved_(AutocastState::Current()) {
    state.Apply();
  }
  ~AutocastScope() { saved_.Apply(); }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState saved_;
};

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
