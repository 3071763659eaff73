// Bounded retention of a job's metric history. Metric events are one row per logged step, so a long
// job would grow the store without end; once a job has more than `max_events` of them, the store
// thins the older ones in the same transaction as the insert that crossed the bound. Other events
// (state changes, checkpoints, warnings, stage changes) are never thinned.
//
// What stays: the job's first metric event, its newest max_events/4 at full resolution (what a
// watcher resuming after a short gap wants), and max_events/4 of the older ones chosen evenly by
// the time they were recorded. Evenly by time, not by position, so repeated thinning keeps the
// whole run evenly covered (thinning by position would halve the oldest part again at every round);
// time, not step, because steps restart with each pipeline stage and repeat after a resume. The
// count drops to about max_events/2, so thinning runs once per max_events/2 inserts: amortised
// O(1).
#ifndef TRAINCTL_COORDINATOR_METRIC_RETENTION_H_
#define TRAINCTL_COORDINATOR_METRIC_RETENTION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainctl {

inline constexpr int kDefaultMaxMetricEventsPerJob = 2000;
// Smaller bounds are raised to this (the rule needs room for first + older + recent points).
inline constexpr int kMinMaxMetricEventsPerJob = 8;

// `times_us`: recording times of one job's metric events, oldest (lowest seq) first. Returns the
// indices into it to delete, ascending; empty while times_us.size() <= max_events. Deterministic.
std::vector<size_t> MetricEventsToThin(const std::vector<int64_t>& times_us, int max_events);

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_METRIC_RETENTION_H_
