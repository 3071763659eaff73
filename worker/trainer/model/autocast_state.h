// The thread-local autocast settings, captured where a forward runs and re-applied around a
// recomputation of it in backward (which may run on another thread, or after the caller left its
// autocast scope). LibTorch 1.13 and 2.x spell the switches differently.
#ifndef TRAINCTL_WORKER_TRAINER_MODEL_AUTOCAST_STATE_H_
#define TRAINCTL_WORKER_TRAINER_MODEL_AUTOCAST_STATE_H_

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace trainctl::model {

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

// Applies a captured state for its lifetime, then restores the one it replaced.
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

}  // namespace trainctl::model

#endif  // TRAINCTL_WORKER_TRAINER_MODEL_AUTOCAST_STATE_H_
