// A Clock that moves only when the test says so.
#ifndef TRAINCTL_TESTS_TESTING_FAKE_CLOCK_H_
#define TRAINCTL_TESTS_TESTING_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace trainctl::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_FAKE_CLOCK_H_
