#include "worker/daemon/log_rate.h"

#include <algorithm>

namespace trainctl {

LogRateLimiter::LogRateLimiter(double bytes_per_second, double burst, absl::Time now)
    : rate_(bytes_per_second), burst_(std::max(burst, 0.0)), tokens_(burst_), last_(now) {}

bool LogRateLimiter::Admit(int64_t bytes, absl::Time now) {
  if (rate_ <= 0) return true;
  if (now > last_) {
    tokens_ = std::min(burst_, tokens_ + rate_ * absl::ToDoubleSeconds(now - last_));
    last_ = now;
  }
  const auto cost = static_cast<double>(bytes);
  if (cost <= tokens_) {
    tokens_ -= cost;
    return true;
  }
  ++held_.lines;
  held_.bytes += bytes;
  return false;
}

LogRateLimiter::HeldBack LogRateLimiter::TakeHeldBack() {
  HeldBack out = held_;
  held_ = HeldBack();
  return out;
}

}  // namespace trainctl
