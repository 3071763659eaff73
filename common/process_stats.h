// Figures about this process from /proc, for metrics and benchmarks.
#ifndef TRAINCTL_COMMON_PROCESS_STATS_H_
#define TRAINCTL_COMMON_PROCESS_STATS_H_

#include <cstdint>

namespace trainctl {

// The peak resident set size (VmHWM) in bytes; 0 where /proc/self/status is not there.
int64_t PeakRssBytes();

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_PROCESS_STATS_H_
