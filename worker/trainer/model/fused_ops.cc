#include "worker/trainer/model/fused_ops.h"

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

#include "worker/trainer/model/cuda/fused_math.h"

#ifdef TRAINCTL_FUSED_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

namespace trainctl::model {
namespace {

using internal::FusedKernelTable;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::indexing::Slice;

std::atomic<bool> g_enabled{true};
std::atomic<const FusedKernelTable*> g_host_kernels{nullptr};

#ifdef TRAINCTL_FUSED_KERNELS
constexpr FusedKernelTable kCudaKernels = {
    &fused::RmsNormForward, &fused::RmsNormBackward, &fused::RmsNormBackwardParts, &fused::Rotary,
    &fused::SwiGluForward,  &fused::SwiGluBackward,  &fused::StatusString,
};
#endif

// The kernels for tensors on `device`; null: the composite forms.
const FusedKernelTable* KernelsFor(const torch::Device& device) {
  if (!g_enabled.load(std::memory_order_relaxed)) return nullptr;
#ifdef TRAINCTL_FUSED_KERNELS
  if (device.is_cuda()) return &kCudaKernels;
#endif
  if (device.is_cpu()) return g_host_kernels.load();
  return nullptr;
}

// The current CUDA stream of the tensors' device: the kernels order with LibTorch's ops around
// them and are captured with them in a CUDA graph. None on CPU.
void* StreamFor(const torch::Device& device) {
#ifdef TRAINCTL_FUSED_KERNELS
  if (device.is_cuda()) return at::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  (void)device;
  return nullptr;
}

// The kernels' device is the current one: set it for the call.
class KernelDeviceGuard {
 public:
  explicit KernelDeviceGuard(const torch::Device& device) {
    if (device.is_cuda()) guard_.reset_device(device);
  }

 private:
  c10::OptionalDeviceGuard guard_;
};

std::optional<fused::DType> KernelDType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return fused::DType::kFloat32;
    case torch::kBFloat16:
      return fused::DType::kBFloat16;
    case torch::kFloat16:
      return fused::DType::kFloat16;
    default:
      return std::nullopt;
  }
}

void Check(const FusedKernelTable& kernels, int status, const char* op) {
  TORCH_CHECK(status == fused::kOk, "fused ", op, " kernel: ", kernels.status_string(status));
}

// The table a forward ran with, for its backward.
void SaveKernels(AutogradContext* ctx, const FusedKernelTable* kernels) {
  ctx->saved_data["kernels"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(kernels));
}

const FusedKernelTable& SavedKernels(AutogradContext* ctx) {
  return *reinterpret_cast<const FusedKernelTable*>(
      static_cast<intptr_t>(ctx->saved_data["kernels"].toInt()));
}

// A stride as the kernels take it: 0 for a dimension of size 1 (whatever its stride, it is never
// stepped, and a 0 does not stop vector accesses).
int64_t StrideOf(const torch::Tensor& t, int64_t dim) {
  return t.size(dim) == 1 ? 0 : t.stride(dim);
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat(
      {-x.index({"...", Slice(half, torch::indexing::None)}), x.index({"...", Slice(0, half)})},
      -1);
}

// ---- RMSNorm ---------------------------------------------------------------------------------

bool RmsNormFusable(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.dim() >= 1 && x.numel() > 0 && weight.dim() == 1 && x.size(-1) == weight.size(0) &&
         x.size(-1) <= fused::kRmsNormMaxDim && x.scalar_type() == weight.scalar_type() &&
         KernelDType(x.scalar_type()).has_value() && x.is_contiguous() && weight.is_contiguous() &&
         x.device() == weight.device();
}

// The forward; `inv_rms`, when given, receives the rows' rsqrt(mean(x^2) + eps) for the backward.
torch::Tensor RmsNormForwardCall(const FusedKernelTable& kernels, const torch::Tensor& x,
                                 const torch::Tensor& weight, double eps, torch::Tensor* inv_rms) {
  KernelDeviceGuard guard(x.device());
  torch::Tensor out = torch::empty_like(x);
  fused::RmsNormForwardArgs a;
  a.x = x.data_ptr();
  a.weight = weight.data_ptr();
  a.out = out.data_ptr();
  a.dim = x.size(-1);
  a.rows = x.numel() / a.dim;
  a.eps = static_cast<float>(eps);
  a.dtype = *KernelDType(x.scalar_type());
  if (inv_rms != nullptr) {
    *inv_rms = torch::empty({a.rows}, x.options().dtype(torch::kFloat32));
    a.inv_rms = inv_rms->data_ptr<float>();
  }
  Check(kernels, kernels.rms_norm_forward(a, StreamFor(x.device())), "RmsNorm forward");
  return out;
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps,
                               const FusedKernelTable* kernels) {
    torch::Tensor inv_rms;
    torch::Tensor out = RmsNormForwardCall(*kernels, x, weight, eps, &inv_rms);
    ctx->save_for_backward({x, weight, inv_rms});
    SaveKernels(ctx, kernels);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const FusedKernelTable& kernels = SavedKernels(ctx);
    KernelDeviceGuard guard(x.device());
    const torch::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    fused::RmsNormBackwardArgs a;
    a.x = x.data_ptr();
    a.weight = weight.data_ptr();
    a.grad_out = dy.data_ptr();
    a.inv_rms = saved[2].data_ptr<float>();
    a.dim = x.size(-1);
    a.rows = x.numel() / a.dim;
    a.dtype = *KernelDType(x.scalar_type());
    torch::Tensor dx, dw, workspace;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x);
      a.grad_x = dx.data_ptr();
    }
    if (ctx->needs_input_grad(1)) {
      dw = torch::empty_like(weight);
      a.grad_weight = dw.data_ptr();
      workspace = torch::empty({kernels.rms_norm_backward_parts(a.rows, a.dim), a.dim},
                               x.options().dtype(torch::kFloat32));
      a.workspace = workspace.data_ptr<float>();
      a.workspace_floats = workspace.numel();
    }
    Check(kernels, kernels.rms_norm_backward(a, StreamFor(x.device())), "RmsNorm backward");
    return {dx, dw, torch::Tensor(), torch::Tensor()};
  }
};

// ---- rotary ----------------------------------------------------------------------------------

// The dtype of q * cos + ...: float32 tables promote a half-precision q.
torch::ScalarType RotaryOutDType(const torch::Tensor& q, const torch::Tensor& cos) {
  return cos.scalar_type() == torch::kFloat32 ? torch::kFloat32 : q.scalar_type();
}

fused::RotaryTensor RotaryView(const torch::Tensor& in, const torch::Tensor& out) {
  fused::RotaryTensor t;
  t.in = in.data_ptr();
  t.out = out.data_ptr();
  t.heads = in.size(1);
  const int64_t dims[3] = {0, 1, 2};  // batch, head, seq of [B, H, T, D]
  for (int i = 0; i < 3; ++i) {
    t.in_stride[i] = StrideOf(in, dims[i]);
    t.out_stride[i] = StrideOf(out, dims[i]);
  }
  return t;
}

// Rotates q and k (forward) or their gradients (backward) into new tensors of `out_dtype`, laid
// out as the inputs are.
std::pair<torch::Tensor, torch::Tensor> RotaryCall(const FusedKernelTable& kernels,
                                                   const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& cos,
                                                   const torch::Tensor& sin, bool backward,
                                                   torch::ScalarType out_dtype) {
  KernelDeviceGuard guard(q.device());
  torch::Tensor q_out = torch::empty_like(q, q.options().dtype(out_dtype));
  torch::Tensor k_out = torch::empty_like(k, k.options().dtype(out_dtype));
  fused::RotaryArgs a;
  a.q = RotaryView(q, q_out);
  a.k = RotaryView(k, k_out);
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  a.table_stride[0] = StrideOf(cos, 0);
  a.table_stride[1] = StrideOf(cos, 1);
  a.batch = q.size(0);
  a.seq = q.size(2);
  a.head_dim = q.size(3);
  a.in_dtype = *KernelDType(q.scalar_type());
  a.table_dtype = *KernelDType(cos.scalar_type());
  a.out_dtype = *KernelDType(out_dtype);
  a.backward = backward;
  Check(kernels, kernels.rotary(a, StreamFor(q.device())),
        backward ? "rotary backward" : "rotary forward");
  return {q_out, k_out};
}

bool RotaryFusable(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                   const torch::Tensor& sin) {
  if (q.dim() != 4 || k.dim() != 4 || cos.dim() != 3 || q.numel() == 0 || k.numel() == 0) {
    return false;
  }
  const int64_t batch = q.size(0), seq = q.size(2), head_dim = q.size(3);
  const bool shapes = k.size(0) == batch && k.size(2) == seq && k.size(3) == head_dim &&
                      (cos.size(0) == batch || cos.size(0) == 1) && cos.size(1) == seq &&
                      cos.size(2) == head_dim && sin.sizes() == cos.sizes() &&
                      sin.strides() == cos.strides();
  const bool layout = q.stride(3) == 1 && k.stride(3) == 1 && cos.stride(2) == 1;
  const auto dtype = KernelDType(q.scalar_type());
  const bool dtypes =
      dtype.has_value() && k.scalar_type() == q.scalar_type() &&
      sin.scalar_type() == cos.scalar_type() &&
      (cos.scalar_type() == q.scalar_type() || cos.scalar_type() == torch::kFloat32);
  const bool devices =
      k.device() == q.device() && cos.device() == q.device() && sin.device() == q.device();
  if (!shapes || !layout || !dtypes || !devices || cos.requires_grad() || sin.requires_grad()) {
    return false;
  }
  fused::RotaryArgs a;  // shapes and dtypes only: the kernels' own limits
  a.q.heads = q.size(1);
  a.k.heads = k.size(1);
  a.batch = batch;
  a.seq = seq;
  a.head_dim = head_dim;
  a.in_dtype = *dtype;
  a.table_dtype = *KernelDType(cos.scalar_type());
  a.out_dtype = *KernelDType(RotaryOutDType(q, cos));
  return fused::RotaryArgsValid(a);
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& cos, const torch::Tensor& sin,
                               const FusedKernelTable* kernels) {
    auto [q_out, k_out] =
        RotaryCall(*kernels, q, k, cos, sin, /*backward=*/false, RotaryOutDType(q, cos));
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = static_cast<int64_t>(q.scalar_type());
    SaveKernels(ctx, kernels);
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    auto last_contiguous = [](const torch::Tensor& g) {
      return g.stride(-1) == 1 ? g : g.contiguous();
    };
    auto [dq, dk] = RotaryCall(SavedKernels(ctx), last_contiguous(grads[0]),
                               last_contiguous(grads[1]), saved[0], saved[1],
                               /*backward=*/true, dtype);
    return {dq, dk, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// ---- SwiGLU ----------------------------------------------------------------------------------

bool SwiGluFusable(const torch::Tensor& gate, const torch::Tensor& up) {
  return gate.numel() > 0 && gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() &&
         KernelDType(gate.scalar_type()).has_value() && gate.is_contiguous() &&
         up.is_contiguous() && gate.device() == up.device();
}

fused::SwiGluArgs SwiGluInputs(const torch::Tensor& gate, const torch::Tensor& up) {
  fused::SwiGluArgs a;
  a.gate = gate.data_ptr();
  a.up = up.data_ptr();
  a.n = gate.numel();
  a.dtype = *KernelDType(gate.scalar_type());
  return a;
}

torch::Tensor SwiGluForwardCall(const FusedKernelTable& kernels, const torch::Tensor& gate,
                                const torch::Tensor& up) {
  KernelDeviceGuard guard(gate.device());
  torch::Tensor out = torch::empty_like(gate);
  fused::SwiGluArgs a = SwiGluInputs(gate, up);
  a.out = out.data_ptr();
  Check(kernels, kernels.swiglu_forward(a, StreamFor(gate.device())), "SwiGLU forward");
  return out;
}

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up, const FusedKernelTable* kernels) {
    torch::Tensor out = SwiGluForwardCall(*kernels, gate, up);
    ctx->save_for_backward({gate, up});
    SaveKernels(ctx, kernels);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& gate = saved[0];
    const FusedKernelTable& kernels = SavedKernels(ctx);
    KernelDeviceGuard guard(gate.device());
    const torch::Tensor dy = grads[0].to(gate.scalar_type()).contiguous();
    fused::SwiGluArgs a = SwiGluInputs(gate, saved[1]);
    a.grad_out = dy.data_ptr();
    torch::Tensor d_gate, d_up;
    if (ctx->needs_input_grad(0)) {
      d_gate = torch::empty_like(gate);
      a.grad_gate = d_gate.data_ptr();
    }
    if (ctx->needs_input_grad(1)) {
      d_up = torch::empty_like(gate);
      a.grad_up = d_up.data_ptr();
    }
    Check(kernels, kernels.swiglu_backward(a, StreamFor(gate.device())), "SwiGLU backward");
    return {d_gate, d_up, torch::Tensor()};
  }
};

bool NeedsGrad(std::initializer_list<const torch::Tensor*> inputs) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const torch::Tensor* t : inputs) {
    if (t->requires_grad()) return true;
  }
  return false;
}

}  // namespace

torch::Tensor RmsNormComposite(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor h = x.to(torch::kFloat32);
  const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * torch::rsqrt(variance + eps)).to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> ApplyRotaryComposite(const torch::Tensor& q,
                                                             const torch::Tensor& k,
                                                             const torch::Tensor& cos,
                                                             const torch::Tensor& sin) {
  const torch::Tensor c = cos.unsqueeze(1);
  const torch::Tensor s = sin.unsqueeze(1);
  return {q * c + RotateHalf(q) * s, k * c + RotateHalf(k) * s};
}

torch::Tensor SwiGluComposite(const torch::Tensor& gate, const torch::Tensor& up) {
  return torch::silu(gate) * up;
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const FusedKernelTable* kernels = KernelsFor(x.device());
  if (kernels == nullptr || !RmsNormFusable(x, weight)) return RmsNormComposite(x, weight, eps);
  if (NeedsGrad({&x, &weight})) return RmsNormFunction::apply(x, weight, eps, kernels)[0];
  return RmsNormForwardCall(*kernels, x, weight, eps, nullptr);
}

std::pair<torch::Tensor, torch::Tensor> ApplyRotary(const torch::Tensor& q, const torch::Tensor& k,
                                                    const torch::Tensor& cos,
                                                    const torch::Tensor& sin) {
  const FusedKernelTable* kernels = KernelsFor(q.device());
  if (kernels == nullptr || !RotaryFusable(q, k, cos, sin)) {
    return ApplyRotaryComposite(q, k, cos, sin);
  }
  if (NeedsGrad({&q, &k})) {
    variable_list out = RotaryFunction::apply(q, k, cos, sin, kernels);
    return {out[0], out[1]};
  }
  return RotaryCall(*kernels, q, k, cos, sin, /*backward=*/false, RotaryOutDType(q, cos));
}

torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  const FusedKernelTable* kernels = KernelsFor(gate.device());
  if (kernels == nullptr || !SwiGluFusable(gate, up)) return SwiGluComposite(gate, up);
  if (NeedsGrad({&gate, &up})) return SwiGluFunction::apply(gate, up, kernels)[0];
  return SwiGluForwardCall(*kernels, gate, up);
}

bool FusedKernelsBuilt() {
#ifdef TRAINCTL_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

void SetFusedKernelsEnabled(bool enabled) { g_enabled.store(enabled); }

bool FusedKernelsEnabled() { return g_enabled.load(); }

namespace internal {

void SetHostKernelsForTesting(const FusedKernelTable* table) { g_host_kernels.store(table); }

}  // namespace internal
}  // namespace trainctl::model
