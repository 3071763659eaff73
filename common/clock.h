// Time as a dependency: components take a Clock* so tests can drive time with FakeClock.
#ifndef TRAINCTL_COMMON_CLOCK_H_
#define TRAINCTL_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
};

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_CLOCK_H_
