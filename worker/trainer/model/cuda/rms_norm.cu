// RMSNorm forward and backward (fused_kernels.h). One block per row, grid-stride over rows: the
// block reads its row once for the sum of squares (warp shuffles, then shared memory across
// warps) and again for the output, which then hits L1/L2. The backward does the same for
// sum(g * n), and accumulates each row's weight gradient in shared memory, one partial row per
// block written once at the end; a second kernel sums the partial rows column by column, in a
// fixed order (deterministic, no atomics).
#include "worker/trainer/model/cuda/device_common.cuh"

namespace trainctl::model::fused {
namespace {

constexpr int kReduceColumns = 32;  // per block of the partial-row reduction, one warp wide
constexpr int kReduceRows = 16;     // warps per block of the partial-row reduction

template <typename T, int V>
__global__ void __launch_bounds__(512)
    RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                         float* __restrict__ inv_rms, int64_t rows, int dim, float eps) {
  __shared__ float scratch[33];
  const int nvec = dim / V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * dim;
    const float sum = BlockSum(RmsNormSumSquares<T, V>(xr, nvec, threadIdx.x, blockDim.x), scratch);
    const float inv = RmsNormInvRms(sum, dim, eps);
    if (inv_rms != nullptr && threadIdx.x == 0) inv_rms[row] = inv;
    RmsNormApply<T, V>(xr, weight, out + row * dim, nvec, inv, threadIdx.x, blockDim.x);
  }
}

// `parts` (null: no weight gradient) receives one row per block; the accumulator lives in
// dynamic shared memory (dim floats) only then.
template <typename T, int V>
__global__ void __launch_bounds__(512)
    RmsNormBackwardKernel(const T* __restrict__ x, const T* __restrict__ weight,
                          const T* __restrict__ dy, const float* __restrict__ inv_rms,
                          T* __restrict__ dx, float* __restrict__ parts, int64_t rows, int dim) {
  extern __shared__ float dw_acc[];
  __shared__ float scratch[33];
  const int nvec = dim / V;
  float* acc = parts != nullptr ? dw_acc : nullptr;
  if (acc != nullptr) RmsNormZeroAcc<V>(acc, nvec, threadIdx.x, blockDim.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * dim;
    const float inv = inv_rms[row];
    const float dot = BlockSum(
        RmsNormGradDot<T, V>(x + offset, dy + offset, weight, nvec, inv, threadIdx.x, blockDim.x),
        scratch);
    RmsNormGradApply<T, V>(x + offset, dy + offset, weight, dx != nullptr ? dx + offset : nullptr,
                           acc, nvec, inv, dot / static_cast<float>(dim), threadIdx.x, blockDim.x);
  }
  if (acc != nullptr) {
    RmsNormStoreAcc<V>(acc, parts + static_cast<int64_t>(blockIdx.x) * dim, nvec, threadIdx.x,
                       blockDim.x);
  }
}

// dw[col] = sum over partial rows: blocks of 32 columns x 16 warps; each warp strides over the
// rows (coalesced along the columns), then the 16 partial sums meet in shared memory.
template <typename T>
__global__ void __launch_bounds__(kReduceColumns* kReduceRows)
    RmsNormWeightGradKernel(const float* __restrict__ parts, int64_t num_parts, int dim,
                            T* __restrict__ dw) {
  __shared__ float tile[kReduceRows][kReduceColumns + 1];
  const int col = blockIdx.x * kReduceColumns + threadIdx.x;
  tile[threadIdx.y][threadIdx.x] =
      col < dim ? RmsNormSumParts(parts, num_parts, dim, col, threadIdx.y, kReduceRows) : 0.f;
  __syncthreads();
  if (threadIdx.y == 0 && col < dim) {
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < kReduceRows; ++r) sum += tile[r][threadIdx.x];
    dw[col] = Scalar<T>::FromFloat(sum);
  }
}

template <typename T, int V>
int LaunchForward(const RmsNormForwardArgs& a, cudaStream_t stream) {
  const int threads = RmsNormThreads(static_cast<int>(a.dim / V));
  int grid = 0;
  if (int s = GridSize(RmsNormForwardKernel<T, V>, threads, 0, a.rows, &grid); s != kOk) return s;
  RmsNormForwardKernel<T, V><<<grid, threads, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.weight), static_cast<T*>(a.out),
      a.inv_rms, a.rows, static_cast<int>(a.dim), a.eps);
  return LaunchStatus();
}

template <typename T, int V>
int LaunchBackward(const RmsNormBackwardArgs& a, cudaStream_t stream) {
  const int dim = static_cast<int>(a.dim);
  const int threads = RmsNormThreads(dim / V);
  const bool want_dw = a.grad_weight != nullptr;
  const size_t shared = want_dw ? sizeof(float) * dim : 0;
  int grid = 0;
  if (int s = GridSize(RmsNormBackwardKernel<T, V>, threads, shared, a.rows, &grid); s != kOk) {
    return s;
  }
  // No more blocks than the workspace has partial rows: each block owns one.
  if (want_dw && grid > a.workspace_floats / dim) grid = static_cast<int>(a.workspace_floats / dim);
  RmsNormBackwardKernel<T, V><<<grid, threads, shared, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.weight),
      static_cast<const T*>(a.grad_out), a.inv_rms, static_cast<T*>(a.grad_x),
      want_dw ? a.workspace : nullptr, a.rows, dim);
  if (int s = LaunchStatus(); s != kOk || !want_dw) return s;
  const dim3 block(kReduceColumns, kReduceRows);
  const int column_blocks = (dim + kReduceColumns - 1) / kReduceColumns;
  RmsNormWeightGradKernel<T>
      <<<column_blocks, block, 0, stream>>>(a.workspace, grid, dim, static_cast<T*>(a.grad_weight));
  return LaunchStatus();
}

}  // namespace

int RmsNormForward(const RmsNormForwardArgs& a, void* stream) {
  if (!RmsNormShapeValid(a.rows, a.dim, a.dtype)) return kInvalidArgument;
  if (a.rows == 0) return kOk;
  if (a.x == nullptr || a.weight == nullptr || a.out == nullptr) return kInvalidArgument;
  const bool wide = RmsNormForwardVec(a) > 1;
  return WithDeviceType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? LaunchForward<T, kWide>(a, AsStream(stream))
                : LaunchForward<T, 1>(a, AsStream(stream));
  });
}

int RmsNormBackward(const RmsNormBackwardArgs& a, void* stream) {
  if (!RmsNormShapeValid(a.rows, a.dim, a.dtype)) return kInvalidArgument;
  if (a.rows == 0) return kOk;
  if (a.x == nullptr || a.weight == nullptr || a.grad_out == nullptr || a.inv_rms == nullptr ||
      (a.grad_weight != nullptr && (a.workspace == nullptr || a.workspace_floats < a.dim))) {
    return kInvalidArgument;
  }
  if (a.grad_x == nullptr && a.grad_weight == nullptr) return kOk;
  const bool wide = RmsNormBackwardVec(a) > 1;
  return WithDeviceType(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    constexpr int kWide = 16 / sizeof(T);
    return wide ? LaunchBackward<T, kWide>(a, AsStream(stream))
                : LaunchBackward<T, 1>(a, AsStream(stream));
  });
}

int64_t RmsNormBackwardParts(int64_t rows, int64_t dim) {
  if (rows < 1 || dim < 1 || dim > kRmsNormMaxDim) return 1;
  // Sized for the widest bfloat16 kernel, the one the model runs; another instantiation only
  // changes how many of these rows are resident at once.
  constexpr int kWide = 8;
  const int threads = RmsNormThreads(static_cast<int>((dim + kWide - 1) / kWide));
  int grid = 0;
  if (GridSize(RmsNormBackwardKernel<__nv_bfloat16, kWide>, threads, sizeof(float) * dim, rows,
               &grid) != kOk) {
    cudaGetLastError();  // a failed query is not an error of anything launched later
    return 1;
  }
  return grid;
}

const char* StatusString(int status) {
  if (status == kOk) return "no error";
  if (status == kInvalidArgument) return "invalid argument";
  return cudaGetErrorString(static_cast<cudaError_t>(status));
}

}  // namespace trainctl::model::fused
