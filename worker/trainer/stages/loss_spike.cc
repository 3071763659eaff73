#include "worker/trainer/stages/loss_spike.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainctl::trainer {

double LossSpikeDetector::Median() const {
  if (losses_.empty()) return 0;
  std::vector<double> sorted(losses_.begin(), losses_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

std::optional<std::string> LossSpikeDetector::Observe(int64_t step, double loss) {
  if (!std::isfinite(loss)) return absl::StrCat("loss ", loss, " at step ", step);
  if (static_cast<int>(losses_.size()) >= std::min(kMinHistory, window_)) {
    const double median = Median();
    if (median > 0 && loss > factor_ * median) {
      return absl::StrCat("loss ", loss, " > ", factor_, " \u00d7 median ", median, " of the last ",
                          losses_.size(), " steps at step ", step);
    }
  }
  losses_.push_back(loss);
  while (static_cast<int>(losses_.size()) > window_) losses_.pop_front();
  return std::nullopt;
}

}  // namespace trainctl::trainer
