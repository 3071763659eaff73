// LogRateLimiter: how much of one rank's output the worker forwards to the coordinator. A token
// bucket over bytes: a line goes when the bucket holds its bytes (a burst of up to `burst` bytes
// goes at once, then `bytes_per_second`); otherwise it is counted as held back. The rank's log file
// on the worker keeps every line either way (worker.h), so only the coordinator's copy thins out.
//
// Not thread-safe: one per rank, used under the worker's lock.
#ifndef TRAINCTL_WORKER_DAEMON_LOG_RATE_H_
#define TRAINCTL_WORKER_DAEMON_LOG_RATE_H_

#include <cstdint>

#include "absl/time/time.h"

namespace trainctl {

class LogRateLimiter {
 public:
  // bytes_per_second <= 0: no limit. The bucket starts full.
  LogRateLimiter(double bytes_per_second, double burst, absl::Time now);

  // Whether a line of `bytes` may be forwarded at `now`; if not, it is counted as held back.
  bool Admit(int64_t bytes, absl::Time now);

  struct HeldBack {
    int64_t lines = 0;
    int64_t bytes = 0;
  };
  // The lines held back since the last call, and starts counting again.
  HeldBack TakeHeldBack();

 private:
  const double rate_;
  const double burst_;
  double tokens_;
  absl::Time last_;
  HeldBack held_;
};

}  // namespace trainctl

#endif  // TRAINCTL_WORKER_DAEMON_LOG_RATE_H_
