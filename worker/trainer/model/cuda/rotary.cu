// Rotary embedding of q and k in one launch, forward and backward (fused_kernels.h): blocks of
// the grid's first row take q, the second row k, each a grid-stride loop over its tensor's items
// (V pairs of one row, fused_math.h's RotaryItem). Consecutive threads take consecutive items of a
// row, then the next head's row, which is the next row in memory for q and k as the projections
// make them, so loads and stores are coalesced; the cos/sin row of a position is read by all its
// heads in turn and stays in L1/L2.
#include "worker/trainer/model/cuda/device_common.cuh"

namespace trainctl::model::fused {
namespace {

constexpr int kThreads = 256;

// blockIdx.y picks the tensor: 0 q, 1 k.
template <typename In, typename Tab, typename Out, int V, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    RotaryKernel(const RotaryArgs a, uint32_t q_items, uint32_t k_items, uint32_t per_row) {
  const bool is_q = blockIdx.y == 0;
  const RotaryTensor& t = is_q ? a.q : a.k;
  const uint32_t items = is_q ? q_items : k_items;
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t item = blockIdx.x * blockDim.x + threadIdx.x; item < items; item += stride) {
    RotaryItem<In, Tab, Out, V, kBackward>(a, t, item / per_row, item % per_row);
  }
}

template <typename In, typename Tab, typename Out, int V, bool kBackward>
int Launch(const RotaryArgs& a, cudaStream_t stream) {
  const int64_t per_row = a.head_dim / 2 / V;
  const int64_t q_items = RotaryRows(a, a.q) * per_row;
  const int64_t k_items = RotaryRows(a, a.k) * per_row;
  const int64_t most = q_items > k_items ? q_items : k_items;
  if (most == 0) return kOk;
  auto kernel = RotaryKernel<In, Tab, Out, V, kBackward>;
  int grid = 0;
  if (int s = GridSize(kernel, kThreads, 0, (most + kThreads - 1) / kThreads, &grid); s != kOk) {
    return s;
  }
  // Both tensors' blocks share the resident slots GridSize counted.
  const unsigned tensors = k_items > 0 ? 2 : 1;
  const dim3 blocks(tensors == 2 && grid > 1 ? (grid + 1) / 2 : grid, tensors);
  kernel<<<blocks, kThreads, 0, stream>>>(a, static_cast<uint32_t>(q_items),
                                          static_cast<uint32_t>(k_items),
                                          static_cast<uint32_t>(per_row));
  return LaunchStatus();
}

// The vector width: 16 bytes of the widest of the three types, or 1 where RotaryVec says the
// pointers or strides do not allow it.
template <typename In, typename Tab, typename Out, bool kBackward>
int LaunchWidest(const RotaryArgs& a, cudaStream_t stream) {
  constexpr size_t kLargest = sizeof(In) > sizeof(Tab)
                                  ? (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out))
                                  : (sizeof(Tab) > sizeof(Out) ? sizeof(Tab) : sizeof(Out));
  constexpr int kWide = static_cast<int>(16 / kLargest);
  return RotaryVec(a) > 1 ? Launch<In, Tab, Out, kWide, kBackward>(a, stream)
                          : Launch<In, Tab, Out, 1, kBackward>(a, stream);
}

// The ten (in, table, out, direction) combinations RotaryDTypesValid admits.
template <typename T>
int LaunchFor(const RotaryArgs& a, cudaStream_t stream) {
  const bool same = a.table_dtype == a.in_dtype && a.out_dtype == a.in_dtype;
  if (a.backward) {
    return same ? LaunchWidest<T, T, T, true>(a, stream)
                : LaunchWidest<float, float, T, true>(a, stream);
  }
  return same ? LaunchWidest<T, T, T, false>(a, stream)
              : LaunchWidest<T, float, float, false>(a, stream);
}

}  // namespace

int Rotary(const RotaryArgs& a, void* stream) {
  if (!RotaryArgsValid(a)) return kInvalidArgument;
  if (RotaryRows(a, a.q) + RotaryRows(a, a.k) == 0) return kOk;
  if (a.q.in == nullptr || a.q.out == nullptr || a.cos == nullptr || a.sin == nullptr ||
      (a.k.heads > 0 && (a.k.in == nullptr || a.k.out == nullptr))) {
    return kInvalidArgument;
  }
  // The low-precision type of the call: the storage type of the rotated tensor (forward: in;
  // backward: out); float32 when all three are.
  const DType t = a.backward ? a.out_dtype : a.in_dtype;
  return WithDeviceType(t, [&](auto zero) {
    using T = decltype(zero);
    return LaunchFor<T>(a, AsStream(stream));
  });
}

}  // namespace trainctl::model::fused
