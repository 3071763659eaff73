// A job's metric history as series, for the GetMetrics RPC: the stored metric events of the job
// grouped by (pipeline stage, metric name), one point per step, downsampled. Pure functions.
#ifndef TRAINCTL_COORDINATOR_METRIC_HISTORY_H_
#define TRAINCTL_COORDINATOR_METRIC_HISTORY_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

inline constexpr int kDefaultMetricPoints = 1000;
inline constexpr int kMaxMetricPoints = 100000;

// At most `max` indices into [0, n), ascending and evenly spread, 0 and n-1 always among them
// (when n > 0); every index when n <= max. `max` < 2 is taken as 2.
std::vector<size_t> EvenlySpacedIndices(size_t n, size_t max);

// `events`: one job's events in seq order (others than metric events are skipped). `names`: the
// metrics wanted, empty for all. `max_points`: 0 for kDefaultMetricPoints; INVALID_ARGUMENT
// outside [0, kMaxMetricPoints] or for an empty name. Series come in the order their stages first
// appear, then by name; a step logged twice keeps its later value. Non-finite values are kept (a
// NaN loss is news).
absl::StatusOr<trainctl::v1::GetMetricsResponse> BuildMetricHistory(
    const std::vector<trainctl::v1::JobEvent>& events, const std::vector<std::string>& names,
    int max_points);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_METRIC_HISTORY_H_
