// Mixed precision the way torch.autocast does it, across LibTorch 1.13 (CPU) and 2.x (CUDA
// nodes), whose autocast switches are spelled differently.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_AUTOCAST_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_AUTOCAST_H_

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace trainctl::trainer::internal {

// Enables autocast to `dtype` on `device` for its lifetime (no-op when !enabled) and restores the
// previous state after.
class AutocastGuard {
 public:
  AutocastGuard(bool enabled, torch::DeviceType device, torch::ScalarType dtype)
      : enabled_(enabled), cuda_(device == torch::kCUDA) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR >= 2
    const auto type = cuda_ ? at::kCUDA : at::kCPU;
    previous_ = at::autocast::is_autocast_enabled(type);
    at::autocast::set_autocast_dtype(type, dtype);
    at::autocast::set_autocast_enabled(type, true);
#else
    if (cuda_) {
      previous_ = at::autocast::is_enabled();
      at::autocast::set_autocast_gpu_dtype(dtype);
      at::autocast::set_enabled(true);
    } else {
      previous_ = at::autocast::is_cpu_enabled();
      at::autocast::set_autocast_cpu_dtype(dtype);
      at::autocast::set_cpu_enabled(true);
    }
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
    at::autocast::set_autocast_enabled(cuda_ ? at::kCUDA : at::kCPU, previous_);
#else
    if (cuda_) {
      at::autocast::set_enabled(previous_);
    } else {
      at::autocast::set_cpu_enabled(previous_);
    }
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  bool cuda_;
  bool previous_ = false;
};

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_AUTOCAST_H_
