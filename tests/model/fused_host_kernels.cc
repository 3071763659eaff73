#include "tests/model/fused_host_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "worker/trainer/model/cuda/fused_math.h"

namespace trainctl::model::fused {

// LibTorch's own half types: the same round-to-nearest-even conversions as CUDA's.
template <>
struct Scalar<c10::BFloat16> {
  static float ToFloat(c10::BFloat16 v) { return static_cast<float>(v); }
  static c10::BFloat16 FromFloat(float v) { return c10::BFloat16(v); }
};

template <>
struct Scalar<c10::Half> {
  static float ToFloat(c10::Half v) { return static_cast<float>(v); }
  static c10::Half FromFloat(float v) { return c10::Half(v); }
};

}  // namespace trainctl::model::fused

namespace trainctl::model::testing {
namespace {

using fused::DType;
using fused::kInvalidArgument;
using fused::kOk;
using fused::RmsNormBackwardArgs;
using fused::RmsNormForwardArgs;
using fused::RotaryArgs;
using fused::RotaryTensor;
using fused::Scalar;
using fused::SwiGluArgs;

// Partial rows of RMSNorm's weight gradient the host asks for: few, so that each "block" takes
// several rows and the sum over parts has more than one term.
constexpr int64_t kHostParts = 3;
// The .cu's reduction block: 16 warps over the partial rows, 32 columns.
constexpr int kReduceRows = 16;

template <typename Fn>
int WithHostType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kBFloat16:
      return fn(c10::BFloat16{});
    case DType::kFloat16:
      return fn(c10::Half{});
  }
  return kInvalidArgument;
}

template <typename T, int V>
int RmsNormForwardOnHost(const RmsNormForwardArgs& a) {
  const int dim = static_cast<int>(a.dim), nvec = dim / V, threads = fused::RmsNormThreads(nvec);
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out);
  for (int64_t row = 0; row < a.rows; ++row) {
    float sum = 0.f;
    for (int t = 0; t < threads; ++t)
      sum += fused::RmsNormSumSquares<T, V>(x + row * dim, nvec, t, threads);
    const float inv = fused::RmsNormInvRms(sum, dim, a.eps);
    if (a.inv_rms != nullptr) a.inv_rms[row] = inv;
    for (int t = 0; t < threads; ++t) {
      fused::RmsNormApply<T, V>(x + row * dim, w, out + row * dim, nvec, inv, t, threads);
    }
  }
  return kOk;
}

template <typename T, int V>
int RmsNormBackwardOnHost(const RmsNormBackwardArgs& a) {
  const int dim = static_cast<int>(a.dim), nvec = dim / V, threads = fused::RmsNormThreads(nvec);
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  const T* dy = static_cast<const T*>(a.grad_out);
  T* dx = static_cast<T*>(a.grad_x);
  const bool want_dw = a.grad_weight != nullptr;
  const int64_t blocks = want_dw ? std::min(a.rows, a.workspace_floats / dim) : 1;
  std::vector<float> acc(dim);
  for (int64_t block = 0; block < blocks; ++block) {
    float* dw_acc = want_dw ? acc.data() : nullptr;
    for (int t = 0; dw_acc != nullptr && t < threads; ++t)
      fused::RmsNormZeroAcc<V>(dw_acc, nvec, t, threads);
    for (int64_t row = block; row < a.rows; row += blocks) {
      const int64_t off = row * dim;
      const float inv = a.inv_rms[row];
      float dot = 0.f;
      for (int t = 0; t < threads; ++t) {
        dot += fused::RmsNormGradDot<T, V>(x + off, dy + off, w, nvec, inv, t, threads);
      }
      for (int t = 0; t < threads; ++t) {
        fused::RmsNormGradApply<T, V>(x + off, dy + off, w, dx != nullptr ? dx + off : nullptr,
                                      dw_acc, nvec, inv, dot / static_cast<float>(dim), t, threads);
      }
    }
    for (int t = 0; dw_acc != nullptr && t < threads; ++t) {
      fused::RmsNormStoreAcc<V>(dw_acc, a.workspace + block * dim, nvec, t, threads);
    }
  }
  if (!want_dw) return kOk;
  T* dw = static_cast<T*>(a.grad_weight);
  for (int col = 0; col < dim; ++col) {
    float sum = 0.f;
    for (int r = 0; r < kReduceRows; ++r) {
      sum += fused::RmsNormSumParts(a.workspace, blocks, dim, col, r, kReduceRows);
    }
    dw[col] = Scalar<T>::FromFloat(sum);
  }
  return kOk;
}

int HostRmsNormForward(const RmsNormForwardArgs& a, void*) {
  HostCalls().rms_norm_forward++;
  if (!fused::RmsNormShapeValid(a.rows, a.dim, a.dtype)) return kInvalidArgument;
  const bool wide = fused::RmsNormForwardVec(a) > 1;
  return WithHostType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? RmsNormForwardOnHost<T, kWide>(a) : RmsNormForwardOnHost<T, 1>(a);
  });
}

int HostRmsNormBackward(const RmsNormBackwardArgs& a, void*) {
  HostCalls().rms_norm_backward++;
  if (!fused::RmsNormShapeValid(a.rows, a.dim, a.dtype) ||
      (a.grad_weight != nullptr && a.workspace_floats < a.dim)) {
    return kInvalidArgument;
  }
  const bool wide = fused::RmsNormBackwardVec(a) > 1;
  return WithHostType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? RmsNormBackwardOnHost<T, kWide>(a) : RmsNormBackwardOnHost<T, 1>(a);
  });
}

int64_t HostRmsNormBackwardParts(int64_t rows, int64_t) {
  return std::max<int64_t>(1, std::min(rows, kHostParts));
}

template <typename In, typename Tab, typename Out, int V, bool kBackward>
int RotaryOnHost(const RotaryArgs& a) {
  const int64_t per_row = a.head_dim / 2 / V;
  for (const RotaryTensor* t : {&a.q, &a.k}) {
    const int64_t items = fused::RotaryRows(a, *t) * per_row;
    for (int64_t item = 0; item < items; ++item) {
      fused::RotaryItem<In, Tab, Out, V, kBackward>(a, *t, static_cast<uint32_t>(item / per_row),
                                                    static_cast<uint32_t>(item % per_row));
    }
  }
  return kOk;
}

template <typename In, typename Tab, typename Out, bool kBackward>
int RotaryWidest(const RotaryArgs& a) {
  constexpr size_t kLargest = std::max({sizeof(In), sizeof(Tab), sizeof(Out)});
  constexpr int kWide = static_cast<int>(16 / kLargest);
  return fused::RotaryVec(a) > 1 ? RotaryOnHost<In, Tab, Out, kWide, kBackward>(a)
                                 : RotaryOnHost<In, Tab, Out, 1, kBackward>(a);
}

int HostRotary(const RotaryArgs& a, void*) {
  (a.backward ? HostCalls().rotary_backward : HostCalls().rotary_forward)++;
  if (!fused::RotaryArgsValid(a)) return kInvalidArgument;
  const bool same = a.table_dtype == a.in_dtype && a.out_dtype == a.in_dtype;
  return WithHostType(a.backward ? a.out_dtype : a.in_dtype, [&](auto zero) {
    using T = decltype(zero);
    if (a.backward) {
      return same ? RotaryWidest<T, T, T, true>(a) : RotaryWidest<float, float, T, true>(a);
    }
    return same ? RotaryWidest<T, T, T, false>(a) : RotaryWidest<T, float, float, false>(a);
  });
}

template <typename T, int V>
int SwiGluOnHost(const SwiGluArgs& a, bool backward) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  const int64_t vectors = a.n / V;
  auto item = [&](auto width, int64_t i) {
    constexpr int kWidth = decltype(width)::value;
    if (backward) {
      fused::SwiGluBackwardItem<T, kWidth>(gate, up, static_cast<const T*>(a.grad_out),
                                           static_cast<T*>(a.grad_gate), static_cast<T*>(a.grad_up),
                                           i);
    } else {
      fused::SwiGluForwardItem<T, kWidth>(gate, up, static_cast<T*>(a.out), i);
    }
  };
  for (int64_t v = 0; v < vectors; ++v) item(std::integral_constant<int, V>{}, v * V);
  for (int64_t i = vectors * V; i < a.n; ++i) item(std::integral_constant<int, 1>{}, i);
  return kOk;
}

int RunSwiGlu(const SwiGluArgs& a, bool backward) {
  if (!fused::ValidDType(a.dtype) || a.n < 0) return kInvalidArgument;
  const bool wide = fused::SwiGluVec(a) > 1;
  return WithHostType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? SwiGluOnHost<T, kWide>(a, backward) : SwiGluOnHost<T, 1>(a, backward);
  });
}

int HostSwiGluForward(const SwiGluArgs& a, void*) {
  HostCalls().swiglu_forward++;
  return RunSwiGlu(a, /*backward=*/false);
}

int HostSwiGluBackward(const SwiGluArgs& a, void*) {
  HostCalls().swiglu_backward++;
  return RunSwiGlu(a, /*backward=*/true);
}

const char* HostStatusString(int status) {
  return status == kOk ? "no error" : status == kInvalidArgument ? "invalid argument" : "unknown";
}

}  // namespace

const internal::FusedKernelTable& HostFusedKernels() {
  static const internal::FusedKernelTable table = {
      &HostRmsNormForward, &HostRmsNormBackward, &HostRmsNormBackwardParts, &HostRotary,
      &HostSwiGluForward,  &HostSwiGluBackward,  &HostStatusString,
  };
  return table;
}

HostKernelCalls& HostCalls() {
  static HostKernelCalls calls;
  return calls;
}

}  // namespace trainctl::model::testing
