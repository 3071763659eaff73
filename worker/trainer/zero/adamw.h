// AdamW over the fp32 slices a ZeRO engine's rank owns, kept apart from the sharded model: a
// trainable engine owns one, a frozen (forward-only) engine none, so a reference model, reward
// model or teacher carries no optimizer state.
//
// One moment pair per slice, in the slice's device and dtype (host memory when the optimizer is
// offloaded). Not thread-safe.
#ifndef TRAINCTL_WORKER_TRAINER_ZERO_ADAMW_H_
#define TRAINCTL_WORKER_TRAINER_ZERO_ADAMW_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace trainctl::zero {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;
  bool adam_w_mode = true;  // decoupled decay (AdamW); false: L2 added to the gradient (Adam)
};

class ShardedAdamW {
 public:
  explicit ShardedAdamW(const AdamWOptions& options) : options_(options) {}

  // Registers a slice of `numel` elements; returns its index for Update.
  size_t AddSlice(int64_t numel, const torch::TensorOptions& options);

  // Starts an optimizer step (advances the bias corrections).
  void BeginStep() { ++step_; }

  // Updates slice `index`'s parameters `p` in place from `grad` (same numel; any dtype) times
  // `coefficient` (unscaling and clipping). `decay_ranges` are [begin, end) element ranges of p
  // that get weight decay.
  void Update(size_t index, torch::Tensor p, const torch::Tensor& grad, double coefficient,
              double lr, const std::vector<std::pair<int64_t, int64_t>>& decay_ranges);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // The two moments of slice `index` ("exp_avg", "exp_avg_sq").
  torch::Tensor& moment(size_t index, const std::string& kind);
  static const std::vector<std::string>& MomentKinds();

  int64_t bytes() const;

 private:
  AdamWOptions options_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> moments_;
  int64_t step_ = 0;
};

}  // namespace trainctl::zero

#endif  // TRAINCTL_WORKER_TRAINER_ZERO_ADAMW_H_
