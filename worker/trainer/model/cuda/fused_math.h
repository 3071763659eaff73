// The arithmetic of the fused kernels (fused_kernels.h), per element, per vector of V elements and
// per thread's share of a row, as functions that nvcc compiles for the device and any C++17
// compiler for the host: the .cu files run them in their grid-stride loops and block reductions,
// and the tests run the very same functions on CPU tensors against LibTorch's composite ops.
//
// Storage types are read into float32 and rounded back through Scalar<T>, which the includer
// specialises for its half types (device_types.cuh: __nv_bfloat16, __half; the tests: c10's).
// Round<T>(v) marks where LibTorch's composite, as HF writes it, rounds an intermediate to the
// storage type; products that LibTorch computes as a separate kernel are MulRn (no FMA
// contraction), so float32 results equal the composite's on CUDA bit for bit where the op order
// is the same.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_CUDA_FUSED_MATH_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_CUDA_FUSED_MATH_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "worker/trainer/model/cuda/fused_kernels.h"

#if defined(__CUDACC__)
#define TRAINCTL_HD __host__ __device__ __forceinline__
#else
#define TRAINCTL_HD inline
#endif
// nvcc's device pass unrolls; the host compilers (g++ under nvcc too) would warn of the pragma.
#if defined(__CUDA_ARCH__)
#define TRAINCTL_UNROLL _Pragma("unroll")
#else
#define TRAINCTL_UNROLL
#endif

namespace trainctl::model::fused {

template <typename T>
struct Scalar;

template <>
struct Scalar<float> {
  static TRAINCTL_HD float ToFloat(float v) { return v; }
  static TRAINCTL_HD float FromFloat(float v) { return v; }
};

// v rounded to T's precision (round to nearest even), as a float.
template <typename T>
TRAINCTL_HD float Round(float v) {
  return Scalar<T>::ToFloat(Scalar<T>::FromFloat(v));
}

TRAINCTL_HD float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TRAINCTL_HD float AddRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TRAINCTL_HD float Exp(float v) {
#ifdef __CUDA_ARCH__
  return expf(v);
#else
  return std::exp(v);
#endif
}

TRAINCTL_HD float Rsqrt(float v) {
#ifdef __CUDA_ARCH__
  return rsqrtf(v);
#else
  return 1.0f / std::sqrt(v);
#endif
}

// V consecutive elements, loaded and stored as one access (16 bytes for the widest V the
// launchers pick): the pointer must be aligned to sizeof(T) * V, which VecWidth checks.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

#if defined(__CUDA_ARCH__)
// The device stores a Pack of 8 or 16 bytes (or several of 16) with one vector store each, in
// PTX: left to itself, nvcc 13 splits some such stores of 2-byte types into 2-byte pairs (the
// second half of the rotary item), four instructions where one does. Every Pack store goes to
// global memory, which st.global addresses with the generic pointer, as CUTLASS's stores do.
template <typename P>
__device__ __forceinline__ void StorePack(void* dst, const P& pack) {
  if constexpr (sizeof(P) % 16 == 0) {
    uint4 w[sizeof(P) / 16];
    memcpy(w, &pack, sizeof(P));
    TRAINCTL_UNROLL
    for (int k = 0; k < static_cast<int>(sizeof(P) / 16); ++k) {
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(static_cast<uint4*>(dst) + k),
                   "r"(w[k].x), "r"(w[k].y), "r"(w[k].z), "r"(w[k].w)
                   : "memory");
    }
  } else if constexpr (sizeof(P) == 8) {
    uint2 w;
    memcpy(&w, &pack, sizeof(P));
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(w.x), "r"(w.y) : "memory");
  } else {
    *static_cast<P*>(dst) = pack;  // 2 or 4 bytes: one access anyway
  }
}
#endif

template <int V, typename T>
TRAINCTL_HD void LoadFloats(const T* p, float (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
  TRAINCTL_UNROLL
  for (int i = 0; i < V; ++i) out[i] = Scalar<T>::ToFloat(pack.v[i]);
}

template <int V, typename T>
TRAINCTL_HD void StoreFloats(T* p, const float (&in)[V]) {
  Pack<T, V> pack;
  TRAINCTL_UNROLL
  for (int i = 0; i < V; ++i) pack.v[i] = Scalar<T>::FromFloat(in[i]);
#if defined(__CUDA_ARCH__)
  StorePack(p, pack);
#else
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
#endif
}

// ---- RMSNorm ---------------------------------------------------------------------------------
// A row of `dim` = nvec * V elements is shared by a block's threads: thread `first` of `step`
// takes vectors first, first + step, ... Between the phases the block sums the threads' partial
// results (a warp-shuffle and shared-memory reduction on the device).

template <typename T, int V>
TRAINCTL_HD float RmsNormSumSquares(const T* x, int nvec, int first, int step) {
  float acc = 0.f;
  for (int v = first; v < nvec; v += step) {
    float xf[V];
    LoadFloats<V>(x + v * V, xf);
    TRAINCTL_UNROLL
    for (int i = 0; i < V; ++i) acc += xf[i] * xf[i];
  }
  return acc;
}

TRAINCTL_HD float RmsNormInvRms(float sum_squares, int dim, float eps) {
  return Rsqrt(sum_squares / static_cast<float>(dim) + eps);
}

// out = weight * (x * inv).to(T): the normalised row rounded to T before the weight multiplies it,
// as Qwen2RMSNorm and HF's do; the product rounded again by the store.
template <typename T, int V>
TRAINCTL_HD void RmsNormApply(const T* x, const T* weight, T* out, int nvec, float inv, int first,
                              int step) {
  for (int v = first; v < nvec; v += step) {
    float xf[V], wf[V], of[V];
    LoadFloats<V>(x + v * V, xf);
    LoadFloats<V>(weight + v * V, wf);
    TRAINCTL_UNROLL
    for (int i = 0; i < V; ++i) of[i] = MulRn(wf[i], Round<T>(xf[i] * inv));
    StoreFloats<V>(out + v * V, of);
  }
}

// Backward, with n = x * inv and g = (dy * weight).to(T) the gradient reaching the cast:
//   dx = inv * (g - n * mean(g * n)),  dweight += dy * n.to(T) (summed over rows).
// Phase 1: this thread's part of sum(g * n).
template <typename T, int V>
TRAINCTL_HD float RmsNormGradDot(const T* x, const T* dy, const T* weight, int nvec, float inv,
                                 int first, int step) {
  float acc = 0.f;
  for (int v = first; v < nvec; v += step) {
    float xf[V], df[V], wf[V];
    LoadFloats<V>(x + v * V, xf);
    LoadFloats<V>(dy + v * V, df);
    LoadFloats<V>(weight + v * V, wf);
    TRAINCTL_UNROLL
    for (int i = 0; i < V; ++i) acc += Round<T>(MulRn(df[i], wf[i])) * (xf[i] * inv);
  }
  return acc;
}

// Phase 2: dx (when not null) and this row's weight gradient added to `dw_acc` (when not null),
// the block's accumulator laid out [V][nvec] (element v * V + i at i * nvec + v), so that
// neighbouring threads touch neighbouring shared-memory banks. A thread only ever touches its own
// vectors' entries, so no synchronisation is needed between rows.
template <typename T, int V>
TRAINCTL_HD void RmsNormGradApply(const T* x, const T* dy, const T* weight, T* dx, float* dw_acc,
                                  int nvec, float inv, float mean_dot, int first, int step) {
  for (int v = first; v < nvec; v += step) {
    float xf[V], df[V], wf[V], gx[V];
    LoadFloats<V>(x + v * V, xf);
    LoadFloats<V>(dy + v * V, df);
    LoadFloats<V>(weight + v * V, wf);
    TRAINCTL_UNROLL
    for (int i = 0; i < V; ++i) {
      const float n = xf[i] * inv;
      gx[i] = inv * (Round<T>(MulRn(df[i], wf[i])) - n * mean_dot);
      if (dw_acc != nullptr) dw_acc[i * nvec + v] += df[i] * Round<T>(n);
    }
    if (dx != nullptr) StoreFloats<V>(dx + v * V, gx);
  }
}

template <int V>
TRAINCTL_HD void RmsNormZeroAcc(float* dw_acc, int nvec, int first, int step) {
  for (int v = first; v < nvec; v += step) {
    TRAINCTL_UNROLL
    for (int i = 0; i < V; ++i) dw_acc[i * nvec + v] = 0.f;
  }
}

// The block's accumulator into its row of the workspace, [dim] in element order.
template <int V>
TRAINCTL_HD void RmsNormStoreAcc(const float* dw_acc, float* part, int nvec, int first, int step) {
  for (int v = first; v < nvec; v += step) {
    float f[V];
    TRAINCTL_UNROLL
    for (int i = 0; i < V; ++i) f[i] = dw_acc[i * nvec + v];
    StoreFloats<V>(part + v * V, f);
  }
}

// Column `col` of the workspace's rows first, first + step, ... < parts.
TRAINCTL_HD float RmsNormSumParts(const float* parts_ptr, int64_t parts, int dim, int col,
                                  int64_t first, int64_t step) {
  float acc = 0.f;
  for (int64_t p = first; p < parts; p += step) acc += parts_ptr[p * dim + col];
  return acc;
}

// ---- rotary ----------------------------------------------------------------------------------
// One item: V pairs (j, j + head_dim / 2) of one row (b, h, s) of q or k. Rows are ordered
// (b, s, h), head fastest: the order of q's memory as the projections make it, and all heads of a
// position read the same table row.
//   forward:  out_lo = in_lo * cos_lo - in_hi * sin_lo,  out_hi = in_hi * cos_hi + in_lo * sin_hi
//   backward: the transpose, i.e. the same with sin_lo, sin_hi replaced by -sin_hi, -sin_lo.
// Each product and the sum rounded to Out, as LibTorch's autograd rounds q * cos,
// rotate_half(q) * sin and their sum (forward) and the two gradients reaching q and their sum
// (backward).
template <typename In, typename Tab, typename Out, int V, bool kBackward>
TRAINCTL_HD void RotaryItem(const RotaryArgs& a, const RotaryTensor& t, uint32_t row,
                            uint32_t vec) {
  const uint32_t heads = static_cast<uint32_t>(t.heads);
  const uint32_t seq = static_cast<uint32_t>(a.seq);
  const uint32_t h = row % heads;
  const uint32_t bs = row / heads;
  const int64_t s = bs % seq, b = bs / seq;
  const int64_t half = a.head_dim / 2, j = static_cast<int64_t>(vec) * V;
  const In* x = static_cast<const In*>(t.in) + b * t.in_stride[0] + h * t.in_stride[1] +
                s * t.in_stride[2] + j;
  Out* o = static_cast<Out*>(t.out) + b * t.out_stride[0] + h * t.out_stride[1] +
           s * t.out_stride[2] + j;
  const int64_t table = b * a.table_stride[0] + s * a.table_stride[1] + j;
  const Tab* c = static_cast<const Tab*>(a.cos) + table;
  const Tab* sn = static_cast<const Tab*>(a.sin) + table;
  float xl[V], xh[V], cl[V], ch[V], sl[V], sh[V], ol[V], oh[V];
  LoadFloats<V>(x, xl);
  LoadFloats<V>(x + half, xh);
  LoadFloats<V>(c, cl);
  LoadFloats<V>(c + half, ch);
  LoadFloats<V>(sn, sl);
  LoadFloats<V>(sn + half, sh);
  TRAINCTL_UNROLL
  for (int i = 0; i < V; ++i) {
    const float sin_lo = kBackward ? -sh[i] : sl[i];
    const float sin_hi = kBackward ? -sl[i] : sh[i];
    ol[i] = AddRn(Round<Out>(MulRn(xl[i], cl[i])), Round<Out>(MulRn(-xh[i], sin_lo)));
    oh[i] = AddRn(Round<Out>(MulRn(xh[i], ch[i])), Round<Out>(MulRn(xl[i], sin_hi)));
  }
  StoreFloats<V>(o, ol);
  StoreFloats<V>(o + half, oh);
}

// ---- SwiGLU ----------------------------------------------------------------------------------
// Elements i .. i + V - 1. Forward: silu(gate) rounded to T, times up (LibTorch's silu then mul).
// Backward: grad_up = dy * silu(gate).to(T); grad_gate = silu'(gate) * (dy * up).to(T), silu' as
// LibTorch's silu_backward writes it.
TRAINCTL_HD float Silu(float g) { return g / (1.f + Exp(-g)); }

template <typename T, int V>
TRAINCTL_HD void SwiGluForwardItem(const T* gate, const T* up, T* out, int64_t i) {
  float g[V], u[V], o[V];
  LoadFloats<V>(gate + i, g);
  LoadFloats<V>(up + i, u);
  TRAINCTL_UNROLL
  for (int k = 0; k < V; ++k) o[k] = MulRn(Round<T>(Silu(g[k])), u[k]);
  StoreFloats<V>(out + i, o);
}

template <typename T, int V>
TRAINCTL_HD void SwiGluBackwardItem(const T* gate, const T* up, const T* grad_out, T* grad_gate,
                                    T* grad_up, int64_t i) {
  float g[V], u[V], dy[V], dg[V], du[V];
  LoadFloats<V>(gate + i, g);
  LoadFloats<V>(up + i, u);
  LoadFloats<V>(grad_out + i, dy);
  TRAINCTL_UNROLL
  for (int k = 0; k < V; ++k) {
    du[k] = MulRn(dy[k], Round<T>(Silu(g[k])));
    const float sigmoid = 1.f / (1.f + Exp(-g[k]));
    dg[k] = Round<T>(MulRn(dy[k], u[k])) * sigmoid * (1.f + g[k] * (1.f - sigmoid));
  }
  if (grad_up != nullptr) StoreFloats<V>(grad_up + i, du);
  if (grad_gate != nullptr) StoreFloats<V>(grad_gate + i, dg);
}

// ---- launch geometry and argument checks (host only) -----------------------------------------

inline bool ValidDType(DType t) {
  return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16;
}

inline int DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }

struct PtrAndSize {
  const void* ptr;
  int size;
};

// The vector width: 16 bytes of the largest element type when every pointer (null ones skipped)
// is aligned to V of its elements and V divides every count in `multiples` (row lengths,
// strides); else 1.
inline int VecWidth(int largest_elem, std::initializer_list<PtrAndSize> ptrs,
                    std::initializer_list<int64_t> multiples) {
  const int v = 16 / largest_elem;
  for (const PtrAndSize& p : ptrs) {
    if (p.ptr != nullptr && reinterpret_cast<uintptr_t>(p.ptr) % (v * p.size) != 0) return 1;
  }
  for (int64_t m : multiples) {
    if (m % v != 0) return 1;
  }
  return v;
}

// Threads per RMSNorm block: one per vector of the row, rounded up to whole warps, 32 to 512.
inline int RmsNormThreads(int nvec) {
  const int t = (nvec + 31) / 32 * 32;
  return t < 32 ? 32 : (t > 512 ? 512 : t);
}

inline bool RmsNormShapeValid(int64_t rows, int64_t dim, DType dtype) {
  return rows >= 0 && dim >= 1 && dim <= kRmsNormMaxDim && ValidDType(dtype);
}

inline int RmsNormForwardVec(const RmsNormForwardArgs& a) {
  const int s = DTypeSize(a.dtype);
  return VecWidth(s, {{a.x, s}, {a.weight, s}, {a.out, s}}, {a.dim});
}

inline int RmsNormBackwardVec(const RmsNormBackwardArgs& a) {
  const int s = DTypeSize(a.dtype);
  return VecWidth(s, {{a.x, s}, {a.weight, s}, {a.grad_out, s}, {a.grad_x, s}, {a.workspace, 4}},
                  {a.dim});
}

// The (in, table, out) dtypes fused_kernels.h lists for RotaryArgs.
inline bool RotaryDTypesValid(const RotaryArgs& a) {
  if (!ValidDType(a.in_dtype) || !ValidDType(a.table_dtype) || !ValidDType(a.out_dtype)) {
    return false;
  }
  if (a.in_dtype == a.table_dtype && a.table_dtype == a.out_dtype) return true;
  if (a.table_dtype != DType::kFloat32) return false;
  return a.backward ? a.in_dtype == DType::kFloat32 && a.out_dtype != DType::kFloat32
                    : a.in_dtype != DType::kFloat32 && a.out_dtype == DType::kFloat32;
}

// Rows of a tensor (batch * seq * heads) and items per row ((head_dim / 2) / v).
inline int64_t RotaryRows(const RotaryArgs& a, const RotaryTensor& t) {
  return a.batch * a.seq * t.heads;
}

// Shapes and dtypes the rotary kernel takes: q present, head_dim even, and every item index of
// q and k together within 31 bits (the kernel decomposes them in 32-bit arithmetic).
inline bool RotaryArgsValid(const RotaryArgs& a) {
  if (!RotaryDTypesValid(a) || a.head_dim < 2 || a.head_dim % 2 != 0 || a.batch < 0 || a.seq < 0 ||
      a.q.heads < 1 || a.k.heads < 0) {
    return false;
  }
  const int64_t per_row = a.head_dim / 2;
  const int64_t rows = RotaryRows(a, a.q) + RotaryRows(a, a.k);
  return rows <= (int64_t{1} << 31) / per_row - 1;
}

inline int RotaryVec(const RotaryArgs& a) {
  const int in = DTypeSize(a.in_dtype), tab = DTypeSize(a.table_dtype),
            out = DTypeSize(a.out_dtype);
  const int largest = in > tab ? (in > out ? in : out) : (tab > out ? tab : out);
  const RotaryTensor& q = a.q;
  const RotaryTensor& k = a.k;
  const bool has_k = k.heads > 0;
  return VecWidth(
      largest,
      {{q.in, in},
       {q.out, out},
       {has_k ? k.in : nullptr, in},
       {has_k ? k.out : nullptr, out},
       {a.cos, tab},
       {a.sin, tab}},
      {a.head_dim / 2, q.in_stride[0], q.in_stride[1], q.in_stride[2], q.out_stride[0],
       q.out_stride[1], q.out_stride[2], has_k ? k.in_stride[0] : 0, has_k ? k.in_stride[1] : 0,
       has_k ? k.in_stride[2] : 0, has_k ? k.out_stride[0] : 0, has_k ? k.out_stride[1] : 0,
       has_k ? k.out_stride[2] : 0, a.table_stride[0], a.table_stride[1]});
}

inline int SwiGluVec(const SwiGluArgs& a) {
  const int s = DTypeSize(a.dtype);
  return VecWidth(
      s, {{a.gate, s}, {a.up, s}, {a.grad_out, s}, {a.out, s}, {a.grad_gate, s}, {a.grad_up, s}},
      {});
}

}  // namespace trainctl::model::fused

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_CUDA_FUSED_MATH_H_
