// SwiGLU forward and backward (fused_kernels.h): element-wise, a grid-stride loop over vectors of
// V elements (16-byte accesses when every pointer allows), then the n % V tail one element at a
// time. The backward recomputes silu(gate) rather than reading a saved copy.
#include "worker/trainer/model/cuda/device_common.cuh"

namespace trainctl::model::fused {
namespace {

constexpr int kThreads = 256;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    SwiGluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                        int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / V;
  for (int64_t v = first; v < vectors; v += stride) SwiGluForwardItem<T, V>(gate, up, out, v * V);
  for (int64_t i = vectors * V + first; i < n; i += stride) {
    SwiGluForwardItem<T, 1>(gate, up, out, i);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    SwiGluBackwardKernel(const T* __restrict__ gate, const T* __restrict__ up,
                         const T* __restrict__ grad_out, T* __restrict__ grad_gate,
                         T* __restrict__ grad_up, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / V;
  for (int64_t v = first; v < vectors; v += stride) {
    SwiGluBackwardItem<T, V>(gate, up, grad_out, grad_gate, grad_up, v * V);
  }
  for (int64_t i = vectors * V + first; i < n; i += stride) {
    SwiGluBackwardItem<T, 1>(gate, up, grad_out, grad_gate, grad_up, i);
  }
}

template <typename T, int V>
int LaunchForward(const SwiGluArgs& a, cudaStream_t stream) {
  int grid = 0;
  const int64_t work = (a.n / V + kThreads - 1) / kThreads;
  if (int s = GridSize(SwiGluForwardKernel<T, V>, kThreads, 0, work, &grid); s != kOk) return s;
  SwiGluForwardKernel<T, V><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(a.gate), static_cast<const T*>(a.up), static_cast<T*>(a.out), a.n);
  return LaunchStatus();
}

template <typename T, int V>
int LaunchBackward(const SwiGluArgs& a, cudaStream_t stream) {
  int grid = 0;
  const int64_t work = (a.n / V + kThreads - 1) / kThreads;
  if (int s = GridSize(SwiGluBackwardKernel<T, V>, kThreads, 0, work, &grid); s != kOk) return s;
  SwiGluBackwardKernel<T, V><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(a.gate), static_cast<const T*>(a.up), static_cast<const T*>(a.grad_out),
      static_cast<T*>(a.grad_gate), static_cast<T*>(a.grad_up), a.n);
  return LaunchStatus();
}

}  // namespace

int SwiGluForward(const SwiGluArgs& a, void* stream) {
  if (!ValidDType(a.dtype) || a.n < 0) return kInvalidArgument;
  if (a.n == 0) return kOk;
  if (a.gate == nullptr || a.up == nullptr || a.out == nullptr) return kInvalidArgument;
  const bool wide = SwiGluVec(a) > 1;
  return WithDeviceType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? LaunchForward<T, kWide>(a, AsStream(stream))
                : LaunchForward<T, 1>(a, AsStream(stream));
  });
}

int SwiGluBackward(const SwiGluArgs& a, void* stream) {
  if (!ValidDType(a.dtype) || a.n < 0) return kInvalidArgument;
  if (a.n == 0 || (a.grad_gate == nullptr && a.grad_up == nullptr)) return kOk;
  if (a.gate == nullptr || a.up == nullptr || a.grad_out == nullptr) return kInvalidArgument;
  const bool wide = SwiGluVec(a) > 1;
  return WithDeviceType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? LaunchBackward<T, kWide>(a, AsStream(stream))
                : LaunchBackward<T, 1>(a, AsStream(stream));
  });
}

}  // namespace trainctl::model::fused
