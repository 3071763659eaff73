// The fused CUDA kernels of the decoder's element-wise hot paths, RMSNorm, rotary embedding and
// SwiGLU, forward and backward, as plain C++ entry points on raw pointers: no LibTorch and no CUDA
// header here, so the kernels build with nvcc alone (CI compiles them without a CUDA LibTorch) and
// the LibTorch side (../fused_ops.h) includes this without the CUDA toolkit.
//
// Numerics are HF's, op by op (fused_math.h says where each value is rounded to the storage type).
// Every entry point launches asynchronously on `stream` (a cudaStream_t; nullptr is the legacy
// default stream), allocates nothing and never synchronises, so it may be captured in a CUDA graph.
// Pointers are device pointers on the current device. Returns kOk, kInvalidArgument (arguments the
// kernels do not take: the caller checks sizes and dtypes first, see fused_ops.cc), or the
// cudaError_t of a failed launch; errors of the kernel itself surface asynchronously, as any CUDA
// kernel's, at the next synchronising call.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_CUDA_FUSED_KERNELS_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_CUDA_FUSED_KERNELS_H_

#include <cstdint>

namespace trainctl::model::fused {

enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

inline constexpr int kOk = 0;
inline constexpr int kInvalidArgument = -1;

// The largest hidden size RMSNorm takes (its backward keeps a row of weight gradients per block
// in 32 KiB of shared memory); Qwen2-VL-72B's 8192 included.
inline constexpr int64_t kRmsNormMaxDim = 8192;

// out = weight * (x * rsqrt(mean(x^2) + eps)).to(dtype) over rows of `dim` contiguous elements,
// x, weight and out of one dtype. `inv_rms` (float32 [rows], may be null) receives each row's
// rsqrt(mean(x^2) + eps) for the backward.
struct RmsNormForwardArgs {
  const void* x = nullptr;
  const void* weight = nullptr;
  void* out = nullptr;
  float* inv_rms = nullptr;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 0;
  DType dtype = DType::kFloat32;
};

// Gradients of RmsNormForward from `grad_out` (contiguous, the dtype of x) and the forward's
// inv_rms. `grad_x` and `grad_weight` may each be null (not wanted). grad_weight needs
// `workspace`: float32 [parts, dim] with 1 <= parts (RmsNormBackwardParts suggests how many);
// workspace_floats = parts * dim.
struct RmsNormBackwardArgs {
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* grad_out = nullptr;
  const float* inv_rms = nullptr;
  void* grad_x = nullptr;
  void* grad_weight = nullptr;
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  DType dtype = DType::kFloat32;
};

// One [batch, heads, seq, head_dim] tensor of a rotary call, last dimension contiguous, other
// strides in elements (q as Qwen2VLAttention makes it is a transposed view: batch, head and seq
// strides T*H*D, D, H*D). heads == 0: absent.
struct RotaryTensor {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t in_stride[3] = {0, 0, 0};   // batch, head, seq
  int64_t out_stride[3] = {0, 0, 0};  // batch, head, seq
};

// Forward: out = in * cos + rotate_half(in) * sin for q and k (one launch), cos and sin
// [batch or 1, seq, head_dim] with equal strides, last dimension contiguous (table_stride: batch,
// 0 when broadcast, then seq). Backward (`backward`): `in` is the gradient of the forward's output
// and `out` receives the gradient of its input (the rotation by -angle, with the forward's
// rounding points). Dtypes (in, table, out): forward (T, T, T) or (T, float32, float32) for T
// bfloat16 / float16, as LibTorch promotes; backward (T, T, T) or (float32, float32, T).
struct RotaryArgs {
  RotaryTensor q;
  RotaryTensor k;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t table_stride[2] = {0, 0};
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head_dim = 0;
  DType in_dtype = DType::kFloat32;
  DType table_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  bool backward = false;
};

// out = silu(gate) * up over `n` contiguous elements of one dtype; backward: grad_gate and
// grad_up (each may be null) from grad_out.
struct SwiGluArgs {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* grad_out = nullptr;  // backward only
  void* out = nullptr;             // forward only
  void* grad_gate = nullptr;       // backward only
  void* grad_up = nullptr;         // backward only
  int64_t n = 0;
  DType dtype = DType::kFloat32;
};

int RmsNormForward(const RmsNormForwardArgs& args, void* stream);
int RmsNormBackward(const RmsNormBackwardArgs& args, void* stream);
// How many partial rows of weight gradients RmsNormBackward's workspace should hold on the
// current device (one per resident block, at most `rows`); 1 when the device cannot be queried.
int64_t RmsNormBackwardParts(int64_t rows, int64_t dim);
int Rotary(const RotaryArgs& args, void* stream);
int SwiGluForward(const SwiGluArgs& args, void* stream);
int SwiGluBackward(const SwiGluArgs& args, void* stream);
// "no error", "invalid argument" or the CUDA runtime's text for a status above; never null.
const char* StatusString(int status);

}  // namespace trainctl::model::fused

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_CUDA_FUSED_KERNELS_H_
