#include "coordinator/metric_retention.h"

#include <algorithm>
#include <cmath>

namespace trainctl {

std::vector<size_t> MetricEventsToThin(const std::vector<int64_t>& times_us, int max_events) {
  const size_t max = static_cast<size_t>(std::max(max_events, kMinMaxMetricEventsPerJob));
  const size_t n = times_us.size();
  if (n <= max) return {};
  const size_t recent = max / 4;   // newest, all kept
  const size_t targets = max / 4;  // picked among the older ones
  const size_t older = n - recent;
  std::vector<bool> keep(n, false);
  keep[0] = true;
  for (size_t i = older; i < n; ++i) keep[i] = true;
  // The older events sorted by time (a clock stepping back leaves them not quite in seq order).
  std::vector<size_t> by_time(older);
  for (size_t i = 0; i < older; ++i) by_time[i] = i;
  std::stable_sort(by_time.begin(), by_time.end(),
                   [&](size_t a, size_t b) { return times_us[a] < times_us[b]; });
  const int64_t first = times_us[by_time.front()];
  const int64_t last = times_us[by_time.back()];
  for (size_t k = 0; k < targets; ++k) {
    const double f = targets == 1 ? 0.0 : static_cast<double>(k) / (targets - 1);
    if (last == first) {  // no spread in time (one burst): evenly by position
      keep[by_time[static_cast<size_t>(std::llround(f * (older - 1)))]] = true;
      continue;
    }
    const int64_t target = first + static_cast<int64_t>(std::llround(f * (last - first)));
    auto it = std::lower_bound(by_time.begin(), by_time.end(), target,
                               [&](size_t i, int64_t t) { return times_us[i] < t; });
    if (it == by_time.end()) --it;
    if (it != by_time.begin() && target - times_us[*(it - 1)] <= times_us[*it] - target) --it;
    keep[*it] = true;
  }
  std::vector<size_t> drop;
  for (size_t i = 0; i < n; ++i) {
    if (!keep[i]) drop.push_back(i);
  }
  return drop;
}

}  // namespace trainctl
