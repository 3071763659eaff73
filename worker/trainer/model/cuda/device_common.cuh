// What the fused kernels' .cu files share: Scalar<> for CUDA's half types, the dtype switch, the
// block reduction, launch sizing and launch error checks. Device code only (nvcc).
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_CUDA_DEVICE_COMMON_CUH_
#define TRAINCTL_WORKER_TRAINER_MODEL_CUDA_DEVICE_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "worker/trainer/model/cuda/fused_kernels.h"
#include "worker/trainer/model/cuda/fused_math.h"

namespace trainctl::model::fused {

template <>
struct Scalar<__nv_bfloat16> {
  static TRAINCTL_HD float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
  static TRAINCTL_HD __nv_bfloat16 FromFloat(float v) { return __float2bfloat16_rn(v); }
};

template <>
struct Scalar<__half> {
  static TRAINCTL_HD float ToFloat(__half v) { return __half2float(v); }
  static TRAINCTL_HD __half FromFloat(float v) { return __float2half_rn(v); }
};

// Calls fn(T{}) with T the device storage type of `dtype`.
template <typename Fn>
int WithDeviceType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kBFloat16:
      return fn(__nv_bfloat16{});
    case DType::kFloat16:
      return fn(__half{});
  }
  return kInvalidArgument;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of `v` over the block, returned to every thread. blockDim.x is a multiple of 32 (at
// most 1024); `scratch` holds 33 floats of shared memory. Safe to call again at once with the same
// scratch: the slot the result goes through is not one the next call's first phase writes, and
// every thread has read it before any thread passes the next call's first barrier.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = WarpSum(lane < warps ? scratch[lane] : 0.f);
    if (lane == 0) scratch[32] = v;
  }
  __syncthreads();
  return scratch[32];
}

// How many blocks of `kernel` (at `threads` and `shared_bytes` of dynamic shared memory) the
// current device holds at once, computed on the first call and remembered: later launches, those
// captured in a CUDA graph included, only read a map. Writes the count, or returns the CUDA error
// of a failed query.
inline int ResidentBlocks(const void* kernel, int threads, size_t shared_bytes, int64_t* blocks) {
  using Key = std::tuple<const void*, int, int, size_t>;  // kernel, device, threads, shared
  static std::mutex mu;
  static std::map<Key, int64_t>* known = new std::map<Key, int64_t>();  // never destroyed
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return static_cast<int>(err);
  const Key key{kernel, device, threads, shared_bytes};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known->find(key); it != known->end()) {
      *blocks = it->second;
      return kOk;
    }
  }
  int sms = 0, per_sm = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes);
  }
  if (err != cudaSuccess) return static_cast<int>(err);
  *blocks = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  std::lock_guard<std::mutex> lock(mu);
  known->emplace(key, *blocks);
  return kOk;
}

// Blocks for `work_blocks` blocks' worth of work: at most the blocks resident at once (the
// kernels loop grid-stride over the rest), at least 1.
template <typename Kernel>
int GridSize(Kernel* kernel, int threads, size_t shared_bytes, int64_t work_blocks, int* grid) {
  int64_t resident = 0;
  if (int s =
          ResidentBlocks(reinterpret_cast<const void*>(kernel), threads, shared_bytes, &resident);
      s != kOk) {
    return s;
  }
  const int64_t blocks = work_blocks < resident ? work_blocks : resident;
  *grid = static_cast<int>(blocks > 0 ? blocks : 1);
  return kOk;
}

// The status of the launch just made: launch-configuration errors are reported here; faults of
// the kernel itself surface at the next synchronising call, as for every CUDA kernel.
inline int LaunchStatus() { return static_cast<int>(cudaGetLastError()); }

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace trainctl::model::fused

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_CUDA_DEVICE_COMMON_CUH_
