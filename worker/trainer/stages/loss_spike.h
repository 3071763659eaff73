// LossSpikeDetector: the loss-spike test of spec.remedies.loss_spike (common/remedies_spec.h),
// run by the loop (stages/loop.cc) on every optimizer step's global-batch loss before the update.
// A loss is a spike when it is NaN or infinite, or, once `kMinHistory` losses are known, greater
// than `factor` times the median of the last `window` ones when that median is positive (a GRPO
// loss near or below zero has no ratio to test). Torch-free; not thread-safe.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_LOSS_SPIKE_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_LOSS_SPIKE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace trainctl::trainer {

class LossSpikeDetector {
 public:
  // Losses known before the ratio test starts (NaN/Inf are spikes from the first step). One: a
  // loss above `factor` times the first (a fresh model's, usually the highest) is divergence.
  static constexpr int kMinHistory = 1;

  // factor > 1, window >= 1 (the spec's checks).
  LossSpikeDetector(double factor, int window) : factor_(factor), window_(window) {}

  // Records the loss of `step`. Returns the evidence when it is a spike ("loss 41.2 > 3 × median
  // 2.1 of the last 20 steps at step 37", "loss nan at step 5"); a spike is not added to the
  // history.
  std::optional<std::string> Observe(int64_t step, double loss);

  // The median of the losses in the window; 0 when none.
  double Median() const;

 private:
  const double factor_;
  const int window_;
  std::deque<double> losses_;  // the last window_ losses, oldest first
};

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_LOSS_SPIKE_H_
