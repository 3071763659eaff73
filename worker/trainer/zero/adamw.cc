#include "worker/trainer/zero/adamw.h"

#include <algorithm>
#include <cmath>

namespace trainctl::zero {

size_t ShardedAdamW::AddSlice(int64_t numel, const torch::TensorOptions& options) {
  moments_.emplace_back(torch::zeros({numel}, options), torch::zeros({numel}, options));
  return moments_.size() - 1;
}

const std::vector<std::string>& ShardedAdamW::MomentKinds() {
  static const std::vector<std::string> kinds = {"exp_avg", "exp_avg_sq"};
  return kinds;
}

torch::Tensor& ShardedAdamW::moment(size_t index, const std::string& kind) {
  return kind == "exp_avg" ? moments_.at(index).first : moments_.at(index).second;
}

int64_t ShardedAdamW::bytes() const {
  int64_t total = 0;
  for (const auto& [m, v] : moments_) {
    total += static_cast<int64_t>(m.numel() * m.element_size() + v.numel() * v.element_size());
  }
  return total;
}

void ShardedAdamW::Update(size_t index, torch::Tensor p, const torch::Tensor& grad,
                          double coefficient, double lr,
                          const std::vector<std::pair<int64_t, int64_t>>& decay_ranges) {
  torch::NoGradGuard no_grad;
  const AdamWOptions& o = options_;
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(step_));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(step_));
  if (o.weight_decay != 0 && o.adam_w_mode) {
    for (const auto& [lo, hi] : decay_ranges)
      p.narrow(0, lo, hi - lo).mul_(1 - lr * o.weight_decay);
  }
  auto& [exp_avg, exp_avg_sq] = moments_.at(index);
  // In chunks, so the step's temporaries stay small next to the slices themselves: 4 MiB on
  // CPUs (cache-sized), 256 MiB on GPUs, where each of the ~8 kernels per chunk costs a launch
  // (1M-element chunks meant ~9000 launches per step for a 1.1B model).
  const int64_t chunk = p.is_cuda() ? int64_t{1} << 26 : int64_t{1} << 20;
  const int64_t numel = p.numel();
  for (int64_t at = 0; at < numel; at += chunk) {
    const int64_t n = std::min(chunk, numel - at);
    torch::Tensor pc = p.narrow(0, at, n);
    torch::Tensor g = grad.narrow(0, at, n).to(p.options(), /*non_blocking=*/false, /*copy=*/true);
    if (coefficient != 1.0) g.mul_(coefficient);
    if (o.weight_decay != 0 && !o.adam_w_mode) {
      for (const auto& [lo, hi] : decay_ranges) {
        const int64_t a = std::max(lo, at), b = std::min(hi, at + n);
        if (a < b) g.narrow(0, a - at, b - a).add_(p.narrow(0, a, b - a), o.weight_decay);
      }
    }
    torch::Tensor m = exp_avg.narrow(0, at, n), v = exp_avg_sq.narrow(0, at, n);
    m.mul_(o.beta1).add_(g, 1 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    torch::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
    pc.addcdiv_(m, denom, -lr / bc1);
  }
}

}  // namespace trainctl::zero
