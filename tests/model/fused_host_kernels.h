// The fused kernels' arithmetic (worker/trainer/model/cuda/fused_math.h) run on the host, in the
// order a launch runs it: each "block" takes its rows in turn, each of its "threads" its vectors
// (the same thread counts, vector widths and partial-row counts as the .cu launchers choose from
// the same functions), and the block sums between the phases. Installed with
// internal::SetHostKernelsForTesting, it lets the autograd Functions of fused_ops.cc run on CPU
// tensors. What it cannot show: the device's warp-shuffle reduction, its scheduling and memory
// model, and nvcc's code for the same functions; tests/gpu runs those.
#ifndef TRAINCTL_TESTS_MODEL_FUSED_HOST_KERNELS_H_
#define TRAINCTL_TESTS_MODEL_FUSED_HOST_KERNELS_H_

#include <atomic>

#include "worker/trainer/model/fused_ops.h"

namespace trainctl::model::testing {

// Calls of each entry point since the process started (tests check the fused path was taken).
struct HostKernelCalls {
  std::atomic<int> rms_norm_forward{0};
  std::atomic<int> rms_norm_backward{0};
  std::atomic<int> rotary_forward{0};
  std::atomic<int> rotary_backward{0};
  std::atomic<int> swiglu_forward{0};
  std::atomic<int> swiglu_backward{0};
};

const internal::FusedKernelTable& HostFusedKernels();
HostKernelCalls& HostCalls();

// Installs the host kernels for the scope; restores the composite forms on CPU after.
class ScopedHostKernels {
 public:
  ScopedHostKernels() { internal::SetHostKernelsForTesting(&HostFusedKernels()); }
  ~ScopedHostKernels() { internal::SetHostKernelsForTesting(nullptr); }
  ScopedHostKernels(const ScopedHostKernels&) = delete;
  ScopedHostKernels& operator=(const ScopedHostKernels&) = delete;
};

}  // namespace trainctl::model::testing

#endif  // TRAINCTL_TESTS_MODEL_FUSED_HOST_KERNELS_H_
